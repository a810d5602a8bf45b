"""A draft budget per source behind prompt lookup (`draft_budget.PerSourceBudget` inside
`proposers.hybrid.LookupThenHeads`): each budgeted source is capped by what ITS steps earned, so
heads whose drafts do not pay go plain without taking lookup's copies with them; by default only
the copies are budgeted (the heads draft as the plan chose); a copy its budget sends plain is a
plain step; greedy stays `generate`'s on two architectures, one row and a batch.

Why it exists: with one budget for both, the main job's plan on SmolLM2 went plain on the first
MT-Bench writing answers (the heads' chain of one did not pay there) and lookup's copies went
undrafted with it (benchmarks/hybrid_budget.py measures the cost)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import draftheads as dh
from draftheads.inference.draft_budget import CAPPED, FULL, PLAIN, DraftBudget, OnlineDraftBudget, PerSourceBudget
from draftheads.inference.proposers import as_drafter
from draftheads.inference.proposers.hybrid import LookupThenHeads
from draftheads.inference.proposers.prompt_lookup import PromptLookupProposer

from inference_utils import greedy_reference, tiny_target
from test_batch import left_padded, reference
from test_draft_budget_decoding import Cycle, Oracle, SyntheticCost

pytestmark = [pytest.mark.online_draft_budget, pytest.mark.usefixtures("one_torch_thread")]


def random_medusa(target) -> torch.nn.Module:
    """Untrained heads: their drafts are (almost) never accepted."""
    torch.manual_seed(0)
    return dh.MedusaHeads.for_target(target, num_heads=2)


def repeating_prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    phrase = torch.randint(4, 64, (7,), generator=g)
    return [torch.cat([phrase, phrase, phrase, phrase[:3]])[None], torch.randint(4, 64, (1, 9), generator=g)]


def test_routing_hands_each_source_its_rows_and_the_step_seconds():
    seen = {}

    class Logged(DraftBudget):
        def __init__(self, name):
            super().__init__()
            self.label = name

        def record(self, drafted, accepted, seconds):
            seen[self.label] = (drafted, list(accepted), seconds)

    budget = PerSourceBudget({"lookup": Logged("lookup"), "heads": Logged("heads")})
    budget.start()
    assert budget.caps([5, 7, 9]) == [5, 7, 9]  # the loop's cap: none, the drafter asks per source
    assert budget.cap("lookup", [5, 9]) == [5, 9] and budget.cap("heads", [7]) == [7]
    budget.routed("lookup", [0, 2], 4)
    budget.routed("heads", [1], 1)
    budget.record(4, [3, 0, 1], 0.25)
    assert seen == {"lookup": (4, [3, 1], 0.25), "heads": (1, [0], 0.25)}
    assert budget.counts == {FULL: 1, CAPPED: 0, PLAIN: 0}
    stats = budget.stats()["draft_budget"]
    assert stats["policy"] == "per-source" and set(stats["sources"]) == {"lookup", "heads"}
    with pytest.raises(ValueError, match="at least one source"):
        PerSourceBudget({})
    # a source without a budget drafts in full, and its steps are nobody's to record
    seen.clear()
    assert budget.cap("other", [6]) == [6]
    budget.routed("other", [0], 6)
    budget.record(6, [2], 0.5)
    assert seen == {} and budget.counts[FULL] == 2


def test_a_source_asked_on_few_steps_probes_on_the_loop_clock():
    """A source routed one step in four (lookup where the text matches) whose drafts never pay goes
    plain, and probes as it would alone, once in 16 to 64 LOOP steps: steps the other source drafted
    run its probe clock (`idle`). On a clock of its own steps it probed once in 256 loop steps."""
    rare = SyntheticCost()
    budget = PerSourceBudget({"rare": rare, "other": DraftBudget()})
    budget.start()
    caps = {}
    for step in range(400):
        source = "rare" if step % 4 == 0 else "other"
        cap = budget.cap(source, [4])[0]
        budget.routed(source, [0], cap)
        budget.record(cap, [0], 1.0 + 0.2 * cap)  # never accepted; a deeper step costs more
        if source == "rare":
            caps[step] = cap
    plain_from = next(step for step, cap in caps.items() if cap == 0 and step > 40)
    probes = [plain_from] + [step for step, cap in caps.items() if step > plain_from and cap > 0]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    # failing probes back off to one in max_probe_every (64) steps of the loop, not of the source
    assert len(gaps) >= 5 and max(gaps) <= rare.max_probe_every + 4, probes


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_default_budget_behind_lookup_is_per_source_and_exact(arch):
    target = tiny_target(arch, seed=1, vocab=64, hidden=32, layers=2)
    decoder = dh.SpeculativeDecoder(target, random_medusa(target), tree=[[0], [1], [0, 0]], prompt_lookup=True)
    assert isinstance(decoder.proposer, LookupThenHeads)
    sources = Counter()
    for ids in repeating_prompts():
        for new in (1, 6, 40):
            out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
            assert out.sequences.tolist() == greedy_reference(target, ids, new).tolist(), (arch, new)
            budget = out.stats["draft_budget"]
            assert budget["policy"] == "per-source" and sum(budget["steps"].values()) == out.stats["steps"]
            assert set(budget["sources"]) == {"lookup"}  # the heads draft as the plan chose
            sources.update(budget["sources"]["lookup"]["steps"])
            sources["heads"] += out.stats["drafted_by"]["heads"]
    assert sum(sources[m] for m in (FULL, CAPPED, PLAIN)) > 0 and sources["heads"] > 0, sources
    ids, mask = left_padded([p[0].tolist() for p in repeating_prompts()])
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    assert torch.equal(out.sequences, reference(target, ids, mask, new=30))
    # an explicit budget serves the whole drafter, as before (one budget for both sources)
    one = dh.SpeculativeDecoder(target, random_medusa(target), tree=[[0], [1], [0, 0]], prompt_lookup=True,
                                draft_budget=OnlineDraftBudget())
    assert one.generate(ids[:1], max_new_tokens=20, eos_token_id=[]).stats["draft_budget"]["policy"] == "online"


class LateCopies(PromptLookupProposer):
    """Prompt lookup that matches nothing before new token ``switch`` and copies the target's known
    greedy continuation from there on (text that starts repeating late in an answer)."""

    def __init__(self, text: list[int], switch: int) -> None:
        super().__init__(num_tokens=8)
        self.text, self.switch = text, switch

    def start(self, input_ids, hidden, params, generator) -> None:
        super().start(input_ids, hidden, params, generator)
        self.prompt_len = input_ids.numel()

    def lookup(self, max_tokens: int) -> tuple[list[int], int]:
        n = len(self._tokens)  # the root included: the copy starts after it
        return ([], 0) if n - self.prompt_len < self.switch else (self.text[n : n + max_tokens], 3)


def steps_after(accept_lengths: list[int], new_tokens: int) -> list[int]:
    """The accepted counts of the steps that started at or after ``new_tokens`` new tokens."""
    done, out = 1, []  # the first token comes from the prefill
    for n in accept_lengths:
        if done >= new_tokens:
            out.append(n)
        done += n
    return out


def test_heads_that_never_pay_do_not_keep_lookups_copies_plain():
    """The failure one shared budget had: the heads' drafts fail for 80 tokens and the budget goes
    plain; then the text starts repeating, and one budget keeps the copies plain until a probe
    lands, while a budget per source drafts them at once. Deterministic: step seconds come from the
    drafted depth (`SyntheticCost`), not the clock."""
    target = tiny_target("llama")
    prompt, new, switch = [5, 9, 33, 17, 8, 3], 240, 80
    text = greedy_reference(target, torch.tensor([prompt]), new)[0].tolist()
    after = {}
    for name, budget in [("shared", SyntheticCost()),
                         ("per source", PerSourceBudget({"lookup": SyntheticCost(), "heads": SyntheticCost()}))]:
        wrong_heads = as_drafter(Oracle({tuple(prompt): text[len(prompt):]}, switch=10**9))  # always one token off
        decoder = dh.SpeculativeDecoder(target, LookupThenHeads(wrong_heads, LateCopies(text, switch)),
                                        draft_budget=budget)
        out = decoder.generate(torch.tensor([prompt]), max_new_tokens=new, eos_token_id=[])
        assert out.sequences[0].tolist() == text, name
        after[name] = steps_after(out.accept_lengths, switch)
    shared, per_source = after["shared"], after["per source"]
    assert max(per_source[:3]) >= 8, per_source  # the first copy is drafted (in full) at once
    assert len(per_source) <= (new - switch) / 8 + 6, per_source  # then copies, a few plain measurements aside
    assert max(shared[:16]) == 1, shared  # the contrast: one budget kept the copies plain until a probe
    assert len(shared) > len(per_source) + 16, (len(shared), len(per_source))


def test_a_copy_its_budget_sends_plain_is_a_plain_step_not_a_heads_draft():
    target = tiny_target("llama", seed=1, vocab=64, hidden=32, layers=2)
    ids = repeating_prompts()[0]
    budget = PerSourceBudget({"lookup": Cycle((0,)), "heads": DraftBudget()})
    decoder = dh.SpeculativeDecoder(target, random_medusa(target), tree=[[0], [1], [0, 0]], prompt_lookup=True,
                                    draft_budget=budget)
    out = decoder.generate(ids, max_new_tokens=40, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 40))
    lookup_steps = out.stats["draft_budget"]["sources"]["lookup"]["steps"]
    assert lookup_steps[PLAIN] > 0 and lookup_steps[FULL] == lookup_steps[CAPPED] == 0
    assert out.stats["drafted_by"]["lookup"] == 0
    # every step lookup matched was plain: as many one-token steps as lookup's plain steps, at least
    assert sum(n == 1 for n in out.accept_lengths) >= lookup_steps[PLAIN]


def test_a_per_source_budget_needs_a_drafter_with_sources():
    target = tiny_target("llama", seed=1, vocab=64, hidden=32, layers=2)
    decoder = dh.SpeculativeDecoder(target, random_medusa(target), tree=[[0], [1], [0, 0]], prompt_lookup=False,
                                    draft_budget=PerSourceBudget({"lookup": DraftBudget()}))
    with pytest.raises(ValueError, match="PerSourceBudget"):
        decoder.generate(repeating_prompts()[0], max_new_tokens=5, eos_token_id=[])
