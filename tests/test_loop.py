"""One decode loop for every mode: batch 1 (dynamic and static cache) and batches step through
`inference.loop.step`, and every row's draft depth is decided in `loop.draft_depths`."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
import draftheads.inference.loop as loop
from draftheads.methods.eagle.drafter import EagleDrafter
from draftheads.methods.medusa.drafter import MedusaDrafter
from draftheads.inference.proposers.sequence import ForkedRows

from inference_utils import greedy_reference, tiny_target

IDS = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
NEW = 10


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


def counting_steps(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = loop.step

    def step(store, proposer, rows, settings):
        calls.append(len(rows.active))
        return original(store, proposer, rows, settings)

    monkeypatch.setattr(loop, "step", step)
    return calls


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_one_row_steps_through_the_loop(target, monkeypatch, cache):
    calls = counting_steps(monkeypatch)
    decoder = dh.SpeculativeDecoder(target, dh.PromptLookupProposer(num_tokens=3), cache=cache)
    out = decoder.generate(IDS, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, IDS, NEW))
    assert calls == [1] * out.stats["steps"] and calls


def test_a_batch_steps_through_the_same_loop(target, monkeypatch):
    calls = counting_steps(monkeypatch)
    ids = torch.cat([IDS, torch.tensor([[9, 3, 4, 8, 1, 2, 3, 4]])])
    out = dh.SpeculativeDecoder(target, dh.PromptLookupProposer(num_tokens=3)).generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                      max_new_tokens=NEW, pad_token_id=0))
    assert calls and calls[0] == 2 and len(calls) == out.stats["steps"]


def test_the_loop_drafts_through_one_drafter_interface(target):
    """Heads draft through their method's drafter; a per-sequence proposer is wrapped once."""
    medusa = dh.MedusaHeads.for_target(target, num_heads=2, num_layers=1)
    assert isinstance(medusa.proposer(tree=None), MedusaDrafter)
    assert isinstance(dh.SpeculativeDecoder(target, medusa, check_model=False).proposer, MedusaDrafter)
    eagle = dh.EagleHead.for_target(target)
    assert isinstance(dh.SpeculativeDecoder(target, eagle, check_model=False).proposer, EagleDrafter)
    lookup = dh.SpeculativeDecoder(target, dh.PromptLookupProposer(num_tokens=3), check_model=False).proposer
    assert isinstance(lookup, ForkedRows) and lookup.name == "PromptLookupProposer"
    with pytest.raises(TypeError, match="expected heads, a Drafter or a Proposer"):
        dh.SpeculativeDecoder(target, object(), check_model=False)


def test_the_former_proposer_names_warn_and_build_the_drafter(target):
    head = dh.EagleHead.for_target(target)
    with pytest.warns(DeprecationWarning, match=r"draftheads\.EagleProposer is deprecated: import EagleDrafter from "
                                                 r"draftheads\.methods\.eagle\.drafter"):
        drafter = dh.EagleProposer(head, total_tokens=4, depth=2, top_k=2)
    assert isinstance(drafter, EagleDrafter) and (drafter.total_tokens, drafter.depth) == (4, 2)
    with pytest.warns(DeprecationWarning, match="MedusaProposer"):
        assert isinstance(dh.MedusaProposer(dh.MedusaHeads.for_target(target, num_heads=2)), MedusaDrafter)


@pytest.mark.parametrize("method", ["medusa", "eagle", "prompt-lookup"])
def test_depth_zero_is_a_plain_step_and_stays_exact(target, monkeypatch, method):
    """The seam a per-step policy caps: depths of 0 make every step a plain one (one token)."""
    source = {"medusa": lambda: dh.MedusaHeads.for_target(target, num_heads=2, num_layers=1),
              "eagle": lambda: dh.EagleDrafter(dh.EagleHead.for_target(target)),
              "prompt-lookup": lambda: dh.PromptLookupProposer(num_tokens=3)}[method]()
    monkeypatch.setattr(loop, "draft_depths", lambda rows, settings: [0] * len(rows.active))
    out = dh.SpeculativeDecoder(target, source).generate(IDS, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, IDS, NEW))
    assert out.accept_lengths == [1] * (NEW - 1) and out.stats["verify_tokens"] == NEW - 1
