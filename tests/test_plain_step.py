"""The plain step (the draft budget's depth 0: the root alone, nothing drafted) through the one
decode loop: exact, no dearer than a step of `generate`, and the proposer still handed every
committed position's target features, so full steps after plain ones draft as well as ever.

A plain step is only worth taking when it costs no more than a `generate` step; on a CPU that
cost is mostly tensor operations dispatched outside the target forward, which
`inference.host_syncs` counts (a load-independent figure: no timing here, see
benchmarks/plain_step.py for the seconds).
"""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

import draftheads as dh
from draftheads.inference import accept, verify
from draftheads.inference.sampling import sample as draw
from draftheads.inference.draft_budget import PLAIN, DraftBudget
from draftheads.inference.host_syncs import HostSyncCounter
from draftheads.methods.eagle.drafter import EagleDrafter
from draftheads.methods.medusa.drafter import MedusaDrafter
from draftheads.inference.sampling import SamplingParams

from inference_utils import greedy_reference, select_features, self_distilled_heads, tiny_target
from stats import chi_square_pvalue, law_pvalue
from test_draft_budget_decoding import Cycle, exact_law
from test_head_types import trained_heads

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NEW = 24


class AlwaysPlain(DraftBudget):
    """Every step plain: what a generation costs when speculation never pays."""

    name = "always-plain"

    def choose(self, rows: int) -> int:
        return 0


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


@pytest.fixture(scope="module")
def trained(target):
    """Heads that draft well for ``target`` (so a stale feature would cost accepted tokens)."""
    return {"medusa": self_distilled_heads(target, steps=60), "eagle": trained_heads(target, "eagle", steps=80),
            "eagle3": trained_heads(target, "eagle3", steps=80)}


def ops_per_step(target, heads, run) -> tuple[float, float]:
    """Tensor operations and host reads of device data outside the target forward, per new token
    after the first (one step each, for `generate` and for a plain-only decoder alike)."""
    with torch.inference_mode(), HostSyncCounter(target, heads) as counter:
        out = run()
    steps = NEW - 1
    assert out.shape[1] > NEW  # every step ran (no early EOS)
    return counter.ops_outside / steps, counter.total_outside / steps


@pytest.fixture(scope="module")
def deep_target():
    """Eight layers, as many as the earlier toy target: per-layer work in a step (cache views) counts as it does there."""
    return tiny_target("llama", layers=8)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_plain_step_dispatches_no_more_tensor_ops_than_a_generate_step(deep_target, kind, temperature):
    target = deep_target
    heads = dh.MedusaHeads.for_target(target, num_heads=3) if kind == "medusa" else dh.EagleHead.for_target(target)
    decoder = dh.SpeculativeDecoder(target, heads, draft_budget=AlwaysPlain())
    ids = torch.tensor([[5, 9, 33, 17, 8, 3]])
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature, "top_k": 0}

    def plain():
        return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, eos_token_id=[],
                               pad_token_id=0, **sampling)

    def speculative():
        out = decoder.generate(ids, max_new_tokens=NEW, temperature=temperature, top_k=0, eos_token_id=[], seed=0)
        assert out.stats["draft_budget"]["steps"][PLAIN] == out.stats["steps"] == NEW - 1
        return out.sequences

    for run in (plain, speculative):  # untimed, uncounted first calls (lazy initialisation)
        run()
    generate_ops, generate_reads = ops_per_step(target, heads, plain)
    ops, reads = ops_per_step(target, heads, speculative)
    assert ops <= generate_ops, f"{kind} T={temperature}: {ops:.1f} tensor ops per plain step, generate {generate_ops:.1f}"
    assert reads <= generate_reads + 1 / (NEW - 1), (reads, generate_reads)  # one per step (+ the first token's)
    if temperature == 0:
        assert torch.equal(decoder.generate(ids, max_new_tokens=NEW, eos_token_id=[]).sequences,
                           greedy_reference(target, ids, NEW))


def test_a_plain_step_takes_the_root_only_path(target, monkeypatch):
    """No tree topology is moved to the device and every sampled token of a plain step is one
    `sampling.sample` in `accept`; the counts would change if the loop fell back to the tree machinery."""
    shapes, draws = [], []
    original_shape, original_draw = verify.shape_on_device, accept.sample
    monkeypatch.setattr(verify, "shape_on_device", lambda shape, *a: shapes.append(shape) or original_shape(shape, *a))
    monkeypatch.setattr(accept, "sample", lambda probs, gen: draws.append(1) or original_draw(probs, gen))
    heads = dh.EagleHead.for_target(target)
    decoder = dh.SpeculativeDecoder(target, heads, draft_budget=AlwaysPlain())
    ids = torch.tensor([[5, 9, 33, 17]])
    shapes.clear()
    out = decoder.generate(ids, max_new_tokens=NEW, temperature=0.8, eos_token_id=[], seed=1)
    assert out.stats["steps"] == NEW - 1 and shapes == [] and len(draws) == NEW - 1
    # a drafting step still takes the tree path
    full = dh.SpeculativeDecoder(target, heads, draft_budget=None)
    full.generate(ids, max_new_tokens=4, eos_token_id=[])
    assert any(shape.size > 1 for shape in shapes)


# -- the proposer after plain steps ---------------------------------------------------------------------
ROWS = {"medusa": MedusaDrafter, "eagle": EagleDrafter, "eagle3": EagleDrafter}


@pytest.mark.parametrize("kind", ["medusa", "eagle", "eagle3"])
def test_plain_steps_hand_the_proposer_the_target_features_of_every_committed_position(target, trained, kind,
                                                                                       monkeypatch):
    """What `accepted` receives after each step is the target's own features (the layers the
    proposer reads) at exactly the positions just committed: a fast path that dropped them, or
    handed the previous step's, fails here (the output would still be exact)."""
    heads, prompts = trained[kind]
    received: list[tuple[list[int], torch.Tensor]] = []
    original = ROWS[kind].accepted

    def recording(self, tokens, hidden):
        received.append((tokens[0].tolist(), hidden[0].clone()))
        return original(self, tokens, hidden)

    monkeypatch.setattr(ROWS[kind], "accepted", recording)
    decoder = dh.SpeculativeDecoder(target, heads, draft_budget=Cycle((0, 0, None, 0, 1)))
    ids = prompts[:1]
    out = decoder.generate(ids, max_new_tokens=NEW, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, NEW))
    assert out.stats["draft_budget"]["steps"][PLAIN] >= NEW // 4
    layers = decoder.verifier.feature_layers
    with torch.no_grad():
        states = target(out.sequences, output_hidden_states=True).hidden_states
    reference = select_features(states, None if layers == (-1,) else list(layers))[0]
    position = ids.shape[1]
    for tokens, hidden in received:
        span = range(position, position + len(tokens))
        assert out.sequences[0, span.start: span.stop].tolist() == tokens
        torch.testing.assert_close(hidden, reference[span.start: span.stop], rtol=1e-4, atol=1e-4)
        position = span.stop
    assert position == out.sequences.shape[1] - 1  # every committed position but the last token's (never verified)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_full_steps_after_plain_ones_draft_as_well_as_drafting_every_step(target, trained, kind):
    heads, prompts = trained[kind]
    lengths, full_lengths = [], []
    for ids in (prompts[:1], prompts[1:2], prompts[2:3]):
        cycled = dh.SpeculativeDecoder(target, heads, draft_budget=Cycle((0, 0, None))).generate(
            ids, max_new_tokens=NEW, eos_token_id=[])
        assert torch.equal(cycled.sequences, greedy_reference(target, ids, NEW))
        lengths += [n for n, cap in zip(cycled.accept_lengths, itertools.cycle((0, 0, None))) if cap is None]
        full_lengths += dh.SpeculativeDecoder(target, heads, draft_budget=None).generate(
            ids, max_new_tokens=NEW, eos_token_id=[]).accept_lengths
    drafting, full = sum(lengths) / len(lengths), sum(full_lengths) / len(full_lengths)
    assert full > 1.5, f"{kind}: the heads accept too little to tell ({full:.2f})"
    assert drafting > 0.8 * full, (kind, lengths, full)


# -- the law of a plain step's token ----------------------------------------------------------------------
def test_draw_follows_the_law_and_never_draws_a_token_without_mass():
    probs = torch.tensor([0.0, 3.0, 0.5, 0.0, 1.5, 5.0, 0.0])  # unnormalised, zeros inside and at the end
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros_like(probs)
    for _ in range(6000):
        counts[draw(probs, gen)] += 1
    assert chi_square_pvalue(counts, probs / probs.sum()) > 1e-3, counts
    assert counts[probs == 0].sum() == 0


def test_draw_past_the_last_cdf_step_falls_back_to_the_last_token_with_mass(monkeypatch):
    """A uniform that rounds onto the total mass finds no CDF step above it: the last token with
    mass is drawn, never one without (or an index past the vocabulary)."""
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.tensor(1.0, dtype=torch.float64))
    assert draw(torch.tensor([0.2, 0.0, 0.7, 0.1, 0.0]), None) == 3


SAMPLE_NEW, RUNS = 4, 2500


def test_plain_only_sampling_follows_the_target_law():
    """Every token drawn by plain steps (`accept.accept_root`), with temperature and top-k applied
    as `generate` applies them."""
    target = tiny_target("llama", seed=3, vocab=6, hidden=32, layers=1)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    prompt = torch.tensor([[1, 4, 3]])
    decoder = dh.SpeculativeDecoder(target, dh.MedusaHeads.for_target(target, num_heads=2), draft_budget=AlwaysPlain())
    gen = torch.Generator().manual_seed(99)
    counts: Counter = Counter()
    for _ in range(RUNS):
        out = decoder.generate(prompt, max_new_tokens=SAMPLE_NEW, temperature=0.7, top_k=4, eos_token_id=[], generator=gen)
        counts[tuple(out.sequences[0, prompt.shape[1]:].tolist())] += 1
    pvalue = law_pvalue(counts, exact_law(target, prompt, SamplingParams(temperature=0.7, top_k=4)))
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: plain steps do not draw from the target's law"
