"""The draft budget's decisions on synthetic steps: plain when speculation cannot pay, back to the
full draft when it pays again, a shallower sub-tree when only the first levels are accepted.

Steps are simulated: a step drafted ``d`` deep accepts what ``accept(step, d)`` says and lasts
``seconds(d)``; no model, no clock, so every decision here is deterministic.
"""
from __future__ import annotations

from collections import deque

import pytest

from draftheads.inference.draft_budget import (
    CAPPED, FULL, MAX_GROW_AFTER, PLAIN, PROBE_FROM_PLAIN, DraftBudget, OnlineDraftBudget, expected_tokens, interpolate, pick_depth, resolve_budget,
)

pytestmark = pytest.mark.online_draft_budget

DEPTH = 3  # the proposer's full draft


def linear_cost(plain: float = 1.0, per_level: float = 0.2):
    return lambda depth: plain + per_level * depth


def simulate(budget, steps, accept, seconds, depth=DEPTH, limit=1000, start=True):
    """Caps the budget gave, step by step (the budget sees each step's outcome only after its cap)."""
    if start:
        budget.start()
    caps = []
    for step in range(steps):
        (cap,) = budget.caps([limit - step])
        drafted = min(cap, depth)
        budget.record(drafted, [min(accept(step, drafted), drafted)], seconds(drafted))
        caps.append(cap)
    return caps


def always_wrong(step, drafted):
    return 0


def always_right(step, drafted):
    return drafted


def test_drafts_that_are_never_accepted_go_plain_and_probes_back_off():
    budget = OnlineDraftBudget()
    caps = simulate(budget, 300, always_wrong, linear_cost())
    assert caps[: budget.warmup] == [1000 - s for s in range(budget.warmup)]  # warm-up: the full draft
    assert budget.counts[PLAIN] >= 280, budget.counts
    # probes from plain steps draft PROBE_FROM_PLAIN deep, never the full draft (it costs the most)
    assert budget.counts[CAPPED] == budget.probes and {c for c in caps if 0 < c < 100} == {PROBE_FROM_PLAIN}
    # probes back: every probe_every steps at first, then less often (the probes keep failing)
    assert 3 <= budget.probes <= 300 // budget.probe_every
    assert budget.probe_interval == budget.max_probe_every


def test_drafts_that_pay_keep_the_full_draft():
    budget = OnlineDraftBudget(remeasure_every=1000)  # re-measuring has its own test
    caps = simulate(budget, 200, always_right, linear_cost(per_level=0.5))  # 4 tokens for 2.5x a plain step
    plain = [s for s, c in enumerate(caps) if c == 0]
    assert len(plain) == budget.min_samples, plain  # only the plain steps that measure what a plain step costs
    assert plain == sorted(plain) and plain[0] == budget.warmup and plain[1] - plain[0] == 2  # interleaved
    assert budget.counts[FULL] == 200 - budget.min_samples and budget.counts[CAPPED] == 0


def test_a_plain_step_is_measured_again_when_its_samples_get_old():
    budget = OnlineDraftBudget(remeasure_every=50)
    caps = simulate(budget, 300, always_right, linear_cost())
    plain = [s for s, c in enumerate(caps) if c == 0]
    assert len(plain) > budget.min_samples
    assert all(b - a <= 52 for a, b in zip(plain, plain[1:])), plain


def test_it_returns_to_the_full_draft_when_drafts_start_paying():
    budget = OnlineDraftBudget()
    switch = 150

    def accept(step, drafted):
        return 0 if step < switch else drafted

    caps = simulate(budget, 400, accept, linear_cost())
    assert sum(c == 0 for c in caps[50:switch]) >= switch - 50 - 8  # plain while drafts fail
    back = next(s for s in range(switch, 400) if all(c >= DEPTH for c in caps[s : s + 20]))
    # within one (backed-off) probe interval plus the few probes that follow a good one
    assert back - switch <= budget.max_probe_every + 6, back
    after = caps[back:]
    # from there on the full draft, but for the plain step that re-measures a plain step's cost
    assert all(c >= DEPTH or c == 0 for c in after) and after.count(0) <= len(after) // budget.remeasure_every + 1, after


def test_steps_that_draft_nothing_are_plain_steps_not_cheap_full_ones():
    """Prompt lookup without a match drafts nothing under any cap and costs a plain step. Filed
    under the full cap, those steps made a 3-deep draft look as cheap as a plain one, so drafts that
    were never accepted kept being drafted whenever a match came."""
    budget = OnlineDraftBudget()
    budget.start()
    matched_caps = []
    for step in range(400):
        (cap,) = budget.caps([1000 - step])
        drafted = min(cap, DEPTH) if step % 3 == 0 else 0  # a match on one step in three
        budget.record(drafted, [0], 1.0 + 0.5 * drafted)  # what is drafted is never accepted
        if step % 3 == 0 and step >= 100:
            matched_caps.append(cap)
    # with a match in hand the budget chooses plain, but for the probes that re-check deep drafts
    assert sum(cap == 0 for cap in matched_caps) >= 0.85 * len(matched_caps), matched_caps
    costs = budget.stats()["draft_budget"]["step_seconds"][1]
    assert costs[0] == 1.0 and costs[DEPTH] == 2.5  # each depth's cost is what a step drafting it took


def test_the_warm_up_waits_for_steps_that_draft():
    """A budget whose first steps find nothing to draft (prompt lookup before the text repeats) has
    learned nothing from them: it keeps the full draft (free: such a step is a plain one) until
    drafting steps have shown what drafts earn, instead of rating every draft at one token."""
    budget = OnlineDraftBudget()
    budget.start()
    caps = []
    for step in range(40):
        (cap,) = budget.caps([1000 - step])
        drafted = 0 if step < 12 else min(cap, DEPTH)  # nothing to draft for 12 steps, then it pays
        budget.record(drafted, [drafted], 1.0 + 0.2 * drafted)
        caps.append(cap)
    assert all(cap != 0 for cap in caps[:12 + budget.warmup]), caps
    assert budget.counts[PLAIN] <= budget.min_samples and budget.reach == [1.0] * DEPTH


def test_a_cap_whose_drafts_are_all_accepted_grows_without_waiting_for_a_probe():
    """Capped at one level while only that level was accepted, the budget has no news of deeper
    levels but from probes; when the capped steps start accepting everything they draft, each
    such step lets the next draft one level deeper, so the full draft is back within a few steps."""
    budget = OnlineDraftBudget(probe_every=64, max_probe_every=64)
    switch = 100
    caps = simulate(budget, 160, lambda step, drafted: min(drafted, 1) if step < switch else drafted,
                    linear_cost(per_level=0.5))
    # capped to level 1, but for a one-level growth that fails now and then (backed off to 1 in 17)
    assert caps[switch - 24 : switch].count(1) >= 21, caps[switch - 24 : switch]
    back = next(s for s in range(switch, 160) if caps[s] >= DEPTH)
    assert back - switch <= MAX_GROW_AFTER + DEPTH, caps[switch : switch + 16]


def test_only_the_first_level_is_accepted_so_the_draft_is_capped_to_it():
    budget = OnlineDraftBudget()
    caps = simulate(budget, 200, lambda step, drafted: min(drafted, 1), linear_cost(per_level=0.5))
    # depth 0: 1 / 1.0, depth 1: 2 / 1.5 (best), depth 2: 2 / 2.0, depth 3: 2 / 2.5
    assert caps[-50:].count(1) >= 45, caps[-50:]
    assert budget.counts[CAPPED] >= 150


def test_a_batch_gets_one_cap_for_every_row_and_its_own_step_costs():
    budget = OnlineDraftBudget()
    budget.start()
    for step in range(60):
        caps = budget.caps([5, 100, 100, 2])
        choice = budget._choice
        expect = [5, 100, 100, 2] if choice is None else [min(choice, x) for x in (5, 100, 100, 2)]
        assert caps == expect
        drafted = min(max(caps), DEPTH)
        budget.record(drafted, [0, 0, 0, 0], 1.0 + 0.4 * drafted)  # four rows, drafts always rejected
    assert budget.counts[PLAIN] > 40
    assert set(budget.stats()["draft_budget"]["step_seconds"]) == {4}  # costs are kept per number of rows
    # a single row has measured nothing: it starts with the full draft again
    budget.start()
    assert budget.caps([100] * 1) == [100]


def test_caps_never_exceed_the_tokens_left():
    budget = OnlineDraftBudget(warmup=1)
    caps = simulate(budget, 40, lambda step, drafted: min(drafted, 1), linear_cost(per_level=0.5), limit=40)
    assert all(cap <= 40 - step for step, cap in enumerate(caps))


def test_off_always_drafts_in_full_and_counts_its_steps():
    budget = resolve_budget(None)
    caps = simulate(budget, 30, always_wrong, linear_cost())
    assert caps == [1000 - s for s in range(30)]
    assert budget.stats() == {"draft_budget": {"policy": "off", "steps": {FULL: 30, CAPPED: 0, PLAIN: 0}}}


def test_what_was_learned_carries_over_to_the_next_generation():
    budget = OnlineDraftBudget()
    simulate(budget, 100, always_wrong, linear_cost())
    assert budget.reach == [0.0] * DEPTH
    caps = simulate(budget, 100, always_right, linear_cost())
    # a new generation starts where the last one ended (plain: drafts were failing), with no warm-up
    # and no new plain measurement, and its first probe finds that drafts pay again
    assert caps[0] == 0 and budget.measurements == 0
    back = next(s for s, cap in enumerate(caps) if cap != 0)
    assert back <= budget.max_probe_every and all(cap != 0 for cap in caps[back + 2 :]), caps


def test_a_generation_starts_from_what_earlier_ones_earned():
    """A budget that forgot earlier generations paid its warm-up's full drafts at the start of every
    generation, where they fail (heads at T = 1), and went plain on the first failures of a text
    that repeats only later (prompt lookup); one that remembers does neither."""
    budget = OnlineDraftBudget()
    simulate(budget, 100, always_wrong, linear_cost())
    caps = simulate(budget, 10, always_wrong, linear_cost())
    assert caps == [0] * 10  # no warm-up of failing full drafts
    budget = OnlineDraftBudget()
    simulate(budget, 100, always_right, linear_cost(per_level=0.1))
    caps = simulate(budget, 10, lambda step, drafted: 0 if step < 3 else drafted, linear_cost(per_level=0.1))
    assert all(cap != 0 for cap in caps), caps


def test_helpers():
    assert expected_tokens([0.9, 0.5, 0.1], 0) == 1.0
    assert expected_tokens([0.9, 0.5, 0.1], 2) == pytest.approx(2.4)
    assert interpolate({0: 1.0, 4: 3.0}, 1) == pytest.approx(1.5)
    assert interpolate({0: 1.0, 4: 3.0}, 4) == 3.0
    assert interpolate({2: 2.0}, 0) == 2.0 and interpolate({2: 2.0}, 5) == 2.0
    # ties and near-ties go to the deeper draft; a clearly faster shallower one wins
    assert pick_depth([1.0, 1.02, 1.0], margin=0.03) == 2
    assert pick_depth([1.2, 1.0, 1.0], margin=0.03) == 0
    # but never a draft expected slower than a plain step, however near (prompt lookup at batch 4,
    # T=0.7: drafts of one token at 0.95x of plain's rate ran every step under margin 0.10)
    assert pick_depth([1.0, 0.95, 0.9], margin=0.10) == 0
    assert pick_depth([1.0, 1.0, 0.95], margin=0.10) == 1


@pytest.mark.parametrize("bad", ["always", 3, 0.5])
def test_bad_budget_arguments_are_named(bad):
    with pytest.raises(ValueError, match="draft_budget must be 'auto'"):
        resolve_budget(bad)


@pytest.mark.parametrize("kwargs", [{"warmup": 0}, {"decay": 1.0}, {"margin": -0.1}, {"window": 0},
                                    {"probe_every": 32, "max_probe_every": 16}, {"marginal": 0.0},
                                    {"min_samples": 20}, {"decay": float("nan")}, {"warmup": "4"}])
def test_bad_budget_settings_are_named(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=f"{name}="):
        OnlineDraftBudget(**kwargs)


def test_resolve_budget_accepts_the_documented_values():
    assert isinstance(resolve_budget("auto"), OnlineDraftBudget)
    assert type(resolve_budget(None)) is DraftBudget
    custom = OnlineDraftBudget(warmup=2)
    assert resolve_budget(custom) is custom


def test_caps_are_compared_on_as_many_samples_as_plain_steps_have():
    """The cap taken every step has many samples and plain only a few: the minimum of many sits
    lower, so each cap's cost is the least of its last n samples, n = plain's sample count."""
    budget = OnlineDraftBudget(window=9, min_samples=3)
    budget._seconds = {1: {0: deque([1.0, 1.0, 1.0]), 3: deque([3.0, 3.0, 3.0, 3.0, 3.0, 1.5, 3.0, 3.0, 3.0])}}
    budget.depth = 3
    assert budget.step_costs(1) == {0: 1.0, 3: 3.0}  # the old 1.5 sample is not among the last three
    budget._seconds[1][0].extend([1.0] * 6)  # nine plain samples: nine of each
    assert budget.step_costs(1) == {0: 1.0, 3: 1.5}
