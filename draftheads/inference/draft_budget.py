"""How deep to draft each step, so that speculation never makes decoding slower than plain steps.

Speculation pays only when the tokens a step commits outweigh what the step costs against a
plain step (the root alone: one token verified, nothing drafted). Both sides move during one
generation (acceptance with the text and the temperature, step cost with the device's load), so
the decode loop asks a `DraftBudget` before every step for a depth cap: the proposer's full
draft, a shallower sub-tree of it, or 0 (a plain step). Every proposer already takes
``propose(root, max_depth)``, so one rule serves them all.

Lossless by construction: the cap of a step is computed from EARLIER steps only (their accepted
counts and their seconds), before the step drafts, so it never depends on that step's target
output; every accepted token is still decided by the verifier against the target's own law. It is
not reproducible from a seed alone: the cap follows measured seconds, so a seeded sampled run can
draft differently run to run (each run is still an exact sample of the target). Pass
``draft_budget=None`` to `SpeculativeDecoder` for seed-reproducible runs (always the full draft).

The module is pure host arithmetic: the loop hands it numbers (`caps` before a step, `record`
after it) and it never touches a tensor, a clock or a model.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Sequence

FULL, CAPPED, PLAIN = "full", "capped", "plain"
MAX_GROW_AFTER = 16  # the most saturated capped steps a one-level growth waits for (see OnlineDraftBudget)
PROBE_FROM_PLAIN = 2  # how deep a probe drafts while plain steps win (see OnlineDraftBudget)


class DraftBudget:
    """Always the full draft (no cap): the off switch, and the interface of every budget.

    A subclass overrides `choose` (the next step's cap: ``None`` = full, 0 = plain, d = at most d
    drafted tokens deep) and `record` (what the step earned and cost); this class turns the choice
    into per-row limits and counts the steps taken in each mode for ``out.stats``."""

    name = "off"

    def __init__(self) -> None:
        self.counts = {FULL: 0, CAPPED: 0, PLAIN: 0}
        self._choice: int | None = None

    def start(self) -> None:
        """A new generation: per-generation counts start again (what was learned about the device may stay)."""
        self.counts = {FULL: 0, CAPPED: 0, PLAIN: 0}
        self._choice = None

    def choose(self, rows: int) -> int | None:
        return None

    def caps(self, limits: Sequence[int]) -> list[int]:
        """Each active row's ``max_depth`` for the next step: its own ``limits[r]`` (tokens left
        before max_new_tokens) under the step's one cap for all rows."""
        choice = self.choose(len(limits))
        self._choice = choice
        self.counts[FULL if choice is None else PLAIN if choice == 0 else CAPPED] += 1
        return [limit if choice is None else min(choice, limit) for limit in limits]

    def record(self, drafted: int, accepted: Sequence[int], seconds: float) -> None:
        """After the step: the deepest tree it drafted (0 = plain), each row's accepted drafted
        tokens (the bonus token excluded), and the step's wall seconds (draft + verify + commit)."""

    def idle(self) -> None:
        """A step this budget was not asked about: another source of the same drafter drafted it
        (`PerSourceBudget`)."""

    #: Whether `verify_depths` reads a drafter's acceptance estimates (`loop.verify_widths` asks
    #: the drafter for them only then: reading them costs a host transfer).
    uses_estimates = False

    def verify_depths(self, estimates: Sequence[Sequence[float]], depths: Sequence[int]) -> list[int]:
        """After drafting, how deep each row's tree is verified, from the drafter's estimates
        (``estimates[r][j-1]``: its chance that row r accepts at least j drafts). The off budget
        verifies everything drafted."""
        return list(depths)

    def stats(self) -> dict[str, Any]:
        return {"draft_budget": {"policy": self.name, "steps": dict(self.counts)}}


def interpolate(known: dict[int, float], depth: int) -> float:
    """``known[depth]`` when measured, else the straight line between the nearest measured depths
    on either side (the nearest one when there is only one side)."""
    if depth in known:
        return known[depth]
    below = [d for d in known if d < depth]
    above = [d for d in known if d > depth]
    if not below or not above:
        return known[max(below)] if below else known[min(above)]
    lo, hi = max(below), min(above)
    return known[lo] + (known[hi] - known[lo]) * (depth - lo) / (hi - lo)


def expected_tokens(reach: Sequence[float], depth: int) -> float:
    """Tokens a step capped at ``depth`` commits: the bonus token plus P(at least j drafts
    accepted) for j = 1..depth (``reach[j - 1]``)."""
    return 1.0 + sum(reach[:depth])


def pick_depth(rates: Sequence[float], margin: float) -> int:
    """The deepest depth whose rate is within ``margin`` of the best and not below a plain
    step's (``rates[0]``): among drafts, a shallower one must be clearly faster to be taken, not a
    timing wobble ahead; but a draft expected to commit fewer tokens per second than plain steps
    is never taken, however near (the margin would otherwise let a budget whose drafts barely
    pay, prompt lookup on text that does not repeat, run up to ``margin`` slower than plain)."""
    best = max(rates)
    for depth in range(len(rates) - 1, 0, -1):
        if rates[depth] * (1.0 + margin) >= best and rates[depth] >= rates[0]:
            return depth
    return 0


class OnlineDraftBudget(DraftBudget):
    """The default budget: each step, the cap with the most expected tokens per second.

    - what a cap earns: ``reach[j - 1]``, the probability that a step drafting at least j deep
      accepts at least j drafts, is an exponential average (``decay`` per step) of what the steps
      of THIS generation that drafted j deep or more showed (a step capped at d tells exactly how
      any cap below d would have done: the accepted path of a truncated tree is the truncated
      path). A cap of d commits 1 + reach[0] + ... + reach[d - 1] tokens. Carried from one
      generation to the next (the decoder keeps one budget per proposer and sampling settings, so
      it is what THIS way of drafting earned at THIS temperature): reset, a generation started
      from nothing, and the few drafts that failed before a text began to repeat sent prompt
      lookup plain until the first probe, 16 steps on.
    - what a cap costs: the least wall seconds of the last ``window`` steps taken at that cap
      (one table per number of active rows), straight lines between measured caps. Kept across
      generations: it is the device's, not the text's. The minimum, not the median: the cap taken
      is measured every step and the others only now and then, so on a machine whose load moves a
      median compares a busy moment with a quiet one; the minimum of each compares quiet with quiet.
      Each over as many recent samples as plain steps have (at most ``window``): the minimum of
      nine samples sits lower than the minimum of two, and with plain measured 2-3 times and the
      full tree every step, EAGLE at batch 8 rated its 16-token tree 1.3x plain steps and ran it at
      0.87x of them.
    - the budget's first ``warmup`` drafting steps take the full draft (nothing is known yet);
      later generations start from the carried ``reach``. Steps, not drafting steps, would end the
      warm-up of a proposer that drafts only now and then (prompt lookup without a match) before
      it has learned anything, and an empty ``reach`` rates every draft at one token.
      Then, until ``min_samples`` plain steps have been measured at this batch size, every other
      step is a plain one (interleaved with full ones); a plain step is measured again when the
      last one is ``remeasure_every`` steps old.
    - the cap taken is the deepest one within ``margin`` of the best rate and no slower than a
      plain step's (ties with plain go to drafting, near-ties to plain).
    - capped steps whose every row accepted all they drafted let the next step draft one level
      deeper (levels below a cap are otherwise measured only by probes: a text that starts to
      repeat, where prompt lookup accepts all it drafts, stayed capped at the one or two levels its
      first success reached until the next probe). A deeper step that fails doubles the run of
      such steps the next growth waits for (up to ``MAX_GROW_AFTER``); one that succeeds resets it.
    - while a shallower cap wins, every ``probe_interval`` steps a probe takes the full draft to
      refresh what deep drafts earn; while plain steps win, a ``PROBE_FROM_PLAIN``-deep draft
      instead (a useless draft model's full 8-token probes cost 3-4 plain steps each, 9% of plain
      speed on the earlier toy target), and the full draft only once one of those pays. A probe that beats the
      current cap's expected rate probes again at once (a good stretch of text is picked up within
      a few steps); a probe whose rate is below ``marginal`` x the winner's doubles the interval
      (up to ``max_probe_every``), which carries from one generation to the next.
    - a drafter that estimates its own drafts' acceptance (DSpark's confidence head,
      `Drafter.acceptance_estimates`) hands this step's estimates over after drafting; with
      ``use_estimates`` (the default) the width verified is then chosen from them
      (`verify_depths`), and the cap before drafting only decides whether to draft at all.
    """

    name = "online"

    def __init__(
        self,
        warmup: int = 4,
        decay: float = 0.9,
        window: int = 9,
        margin: float = 0.10,
        probe_every: int = 16,
        max_probe_every: int = 64,
        marginal: float = 0.85,
        remeasure_every: int = 64,
        min_samples: int = 3,
        use_estimates: bool = True,
    ) -> None:
        super().__init__()
        def number(value: Any, whole: bool) -> bool:
            kinds = (int,) if whole else (int, float)
            return not isinstance(value, bool) and isinstance(value, kinds) and math.isfinite(value)

        checks = (
            ("warmup", warmup, True, lambda v: v >= 1), ("decay", decay, False, lambda v: 0.0 <= v < 1.0),
            ("window", window, True, lambda v: v >= 1), ("margin", margin, False, lambda v: v >= 0.0),
            ("probe_every", probe_every, True, lambda v: v >= 1),
            ("max_probe_every", max_probe_every, True, lambda v: v >= probe_every),
            ("marginal", marginal, False, lambda v: 0.0 < v <= 1.0),
            ("remeasure_every", remeasure_every, True, lambda v: v >= 1),
            ("min_samples", min_samples, True, lambda v: 1 <= v <= window),
        )
        for name, value, whole, ok in checks:
            if not number(value, whole) or not ok(value):
                raise ValueError(f"OnlineDraftBudget: {name}={value!r} is out of range "
                                 "(warmup, window, probe_every, remeasure_every: whole numbers >= 1; 0 <= decay < 1; "
                                 "margin >= 0; max_probe_every >= probe_every; 0 < marginal <= 1; "
                                 "1 <= min_samples <= window)")
        self.warmup, self.decay, self.window, self.margin = warmup, decay, window, margin
        self.probe_every, self.max_probe_every, self.marginal = probe_every, max_probe_every, marginal
        self.remeasure_every, self.min_samples = remeasure_every, min_samples
        if not isinstance(use_estimates, bool):
            raise ValueError(f"OnlineDraftBudget: use_estimates must be True or False, got {use_estimates!r}")
        self.use_estimates = use_estimates
        self._estimated = False  # a drafter handed estimates: the verify width is chosen from them after drafting
        self.estimate_cuts = 0  # steps whose verify width the estimates cut (this generation)
        self._since_full = 0  # estimate-driven steps since the last one verifying every draft
        self.probe_interval = probe_every  # backs off while probes fail; carried across generations
        self.depth = 0  # deepest tree a full step has drafted (the proposer's full draft)
        self._seconds: dict[int, dict[int, deque[float]]] = {}  # rows -> cap -> last seconds
        self._measured_at: dict[int, dict[int, int]] = {}  # rows -> cap -> step count of its last sample
        self._steps = 0  # every step this budget has seen, all generations
        self.reach: list[float] = []  # carried across generations (see the class docstring)
        self._drafting_steps = 0  # steps that drafted at least one token, all generations
        self.start()

    def start(self) -> None:
        super().start()
        self._generation_steps = 0
        self._since_probe = 0
        self._probing = False
        self._escalate = False  # the last probe paid: the next one drafts in full
        self._rows = 1
        self.probes = self.measurements = 0
        self._expected_rate: float | None = None  # what the current (non-full) choice promises
        self._saturated_run = 0  # capped steps in a row whose rows all accepted every drafted token
        self._last_cap = 0  # the cap of the last capped step
        self._grow_after = 1  # saturated capped steps the next one-level growth waits for
        self._growing = False  # this step drafts one level deeper than the last capped one
        self.estimate_cuts = 0

    # -- estimates --------------------------------------------------------------------------------
    def expected_tokens(self, depth: int) -> float:
        return expected_tokens(self.reach, depth)

    def step_costs(self, rows: int) -> dict[int, float]:
        """Estimated seconds of a step at each measured cap with ``rows`` active rows: the least of
        its last n samples, n = how many plain steps were measured (class docstring)."""
        samples = self._seconds[rows]
        n = max(len(samples.get(0, ())), 1)
        return {cap: min(list(seconds)[-n:]) for cap, seconds in samples.items()}

    def rates(self, rows: int) -> list[float]:
        """Expected tokens per second of every cap 0..depth (per row: every row drafts the same cap)."""
        costs = self.step_costs(rows)
        return [self.expected_tokens(d) / max(interpolate(costs, d), 1e-12) for d in range(self.depth + 1)]

    # -- the decision -----------------------------------------------------------------------------
    def choose(self, rows: int) -> int | None:
        choice = self._choose(rows)
        if self._estimated and choice not in (None, 0):
            # The drafter's estimates decide the width after drafting (`verify_depths`): before it,
            # only whether to draft at all. A capped draft of a one-forward drafter costs the same
            # forward and would hide the deeper slots from the estimates.
            return None
        return choice

    def _choose(self, rows: int) -> int | None:
        self._rows, self._probing = rows, False
        self._generation_steps += 1
        measured = self._seconds.get(rows, {})  # the caps measured at this row count
        if self._drafting_steps < self.warmup or self.depth == 0 or self.depth not in measured:
            return None
        plain_samples = len(measured.get(0, ()))
        if plain_samples < self.min_samples:
            # Plain steps measured between full ones, not back to back: a burst of load then
            # weighs on both sides of the comparison instead of on one.
            if self._generation_steps % 2 == 1 or 0 not in measured:
                self.measurements += 1
                return 0
            return None
        rates = self.rates(rows)
        depth = pick_depth(rates, self.margin)
        grow = self._saturated_run >= self._grow_after and depth <= self._last_cap < self.depth
        if grow:
            depth = self._last_cap + 1
        if depth == self.depth:
            self._since_probe, self.probe_interval = 0, self.probe_every
            if self._steps - self._measured_at[rows][0] > self.remeasure_every:
                self.measurements += 1
                return 0  # the growth, if any, waits for the next step
            self._growing, self._saturated_run = grow, 0 if grow else self._saturated_run
            return None
        self._growing, self._saturated_run = grow, 0 if grow else self._saturated_run
        self._expected_rate = rates[depth]
        self._since_probe += 1
        if self._since_probe >= self.probe_interval:
            self._since_probe, self._probing = 0, True
            self.probes += 1
            probe = self.depth if depth > 0 or self._escalate else min(PROBE_FROM_PLAIN, self.depth)
            self._escalate = False
            if rates[probe] < self.marginal * rates[depth]:
                self.probe_interval = min(2 * self.probe_interval, self.max_probe_every)
            else:
                self.probe_interval = self.probe_every
            return None if probe == self.depth else probe
        return depth

    def record(self, drafted: int, accepted: Sequence[int], seconds: float) -> None:
        choice = self._choice
        if choice is None:
            self.depth = max(self.depth, drafted)
        # What the step really ran: its cost and its accepted counts belong to the depth it DRAFTED,
        # not to the cap it was allowed (the row limits near max_new_tokens cut a cap; prompt lookup
        # without a match drafts nothing under any cap, and such a step costs a plain step: filed
        # under the full cap it made a deep draft look as cheap as a plain one).
        cap = min(drafted, self.depth)
        full_accept = cap > 0 and bool(accepted) and min(accepted) >= cap
        if self._growing:
            self._grow_after = 1 if full_accept else min(2 * self._grow_after, MAX_GROW_AFTER)
            self._growing = False
        if choice is not None and cap > 0 and not self._probing:  # a shallow probe's success escalates instead
            self._saturated_run, self._last_cap = (self._saturated_run + 1 if full_accept else 0), cap
        elif choice is None:
            self._saturated_run = 0  # a full step measured every level itself (a plain one measures none)
        rows = max(len(accepted), 1)
        self._steps += 1
        samples = self._seconds.setdefault(rows, {}).setdefault(cap, deque(maxlen=self.window))
        samples.append(max(float(seconds), 0.0))
        self._measured_at.setdefault(rows, {})[cap] = self._steps
        if cap > 0 and accepted:
            self._drafting_steps += 1
            while len(self.reach) < cap:
                self.reach.append(-1.0)  # unseen yet: the first observation sets it
            for j in range(1, cap + 1):
                hit = sum(a >= j for a in accepted) / len(accepted)
                old = self.reach[j - 1]
                self.reach[j - 1] = hit if old < 0 else self.decay * old + (1.0 - self.decay) * hit
        if self._probing and self._expected_rate is not None and accepted:
            earned = (1.0 + sum(accepted) / len(accepted)) / max(seconds, 1e-12)
            if earned >= self._expected_rate:
                self._since_probe, self._escalate = self.probe_interval, True  # the next step probes again, in full

    @property
    def uses_estimates(self) -> bool:
        return self.use_estimates

    def verify_depths(self, estimates: Sequence[Sequence[float]], depths: Sequence[int]) -> list[int]:
        """The verify width with the most expected tokens per second, from the drafter's estimates
        and this budget's step costs (the least seconds measured per cap at this row count, straight
        lines between): the rows' draft slots are admitted best-estimate first (each row's first
        one always: it is drafted already and costs next to nothing to verify), so that T of them
        expect ``rows + sum of their estimates`` tokens at the cost of a step capped at T / rows; the
        deepest T within ``margin`` of the best rate is taken (as for caps: a shallower width must be
        clearly faster). Until steps deeper than one draft are measured at this row count, and every
        ``probe_every`` steps (so that the full width's cost stays measured), everything is verified.
        A row's estimates only ever decrease with depth, so the admitted slots are prefixes."""
        self._estimated = True
        depths = list(depths)
        drafting = [r for r, d in enumerate(depths) if d > 0 and len(estimates[r]) >= 1]
        measured = self._seconds.get(len(depths), {})
        deeper = [c for c in measured if c > 1]
        self._since_full += 1
        if not drafting or not deeper or self._since_full >= self.probe_every:
            self._since_full = 0
            return depths
        costs = self.step_costs(len(depths))
        costs.pop(0, None)  # after drafting, not verifying costs the draft all the same: plain's rate is no option
        rows = len(depths)
        base = float(rows + sum(estimates[r][0] for r in drafting))
        slots = sorted(((float(estimates[r][j]), r) for r in drafting for j in range(1, min(depths[r], len(estimates[r])))),
                       key=lambda item: -item[0])
        gains, rates = [0.0], []
        for value, _ in slots:
            gains.append(gains[-1] + value)
        for admitted, gain in enumerate(gains):
            width = (len(drafting) + admitted) / rows
            rates.append((base + gain) / max(interpolate(costs, width), 1e-12))
        best = max(rates)
        admitted = max(t for t, rate in enumerate(rates) if rate * (1.0 + self.margin) >= best)
        out = [1 if r in drafting else d for r, d in enumerate(depths)]
        for _, r in slots[:admitted]:
            out[r] += 1
        out = [min(o, d) for o, d in zip(out, depths)]
        if out != depths:
            self.estimate_cuts += 1
        return out

    def idle(self) -> None:
        # The probe clock runs on steps, not on this source's steps: prompt lookup behind the heads
        # is asked only where the text matches, a small share of the steps on prose, so a clock of
        # its own steps probed a plain-going copy budget far less often than lookup alone's does.
        self._since_probe += 1

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["draft_budget"].update(
            {"probes": self.probes, "plain_measurements": self.measurements, "full_depth": self.depth,
             "estimate_cuts": self.estimate_cuts,
             "reach": [round(r, 4) for r in self.reach],
             "step_seconds": {rows: dict(sorted(self.step_costs(rows).items())) for rows in self._seconds}}
        )
        return out


class PerSourceBudget(DraftBudget):
    """One budget per drafting source of a drafter that routes each row, each step, to one source
    (`proposers.hybrid.LookupThenHeads`: prompt lookup's copy where the text matches, the heads
    elsewhere), so that each source is judged on its own steps.

    One budget for both judged them together: where the heads' drafts did not pay (first answers
    of MT-Bench writing on SmolLM2) it went plain, and lookup's copies, which pay many tokens deep
    whenever they come, were then drafted only when a probe happened to fall on one.

    The loop sees a budget that caps nothing (`caps` returns the row limits); the drafter asks
    `cap` for the rows of each source once it knows which rows that is, and says with `routed`
    which rows each source drafted and how deep; `record` hands each source its rows' accepted
    counts and the step's seconds. A source with no budget here drafts in full (`cap` returns its
    limits, and its steps are not recorded). A row a source's budget sends plain is a plain step
    (it is not handed to another source: a plain sample must cost a plain step). With several rows
    split between sources in one step, each source is charged the whole step's seconds (an
    over-estimate of each one's share that falls on both sides alike)."""

    name = "per-source"

    def __init__(self, sources: dict[str, DraftBudget]) -> None:
        super().__init__()
        if not sources:
            raise ValueError("PerSourceBudget needs at least one source")
        self.sources = dict(sources)
        self._routed: list[tuple[str, list[int], int]] = []
        self._unbudgeted = False

    def start(self) -> None:
        super().start()
        for budget in self.sources.values():
            budget.start()
        self._routed, self._unbudgeted = [], False

    def caps(self, limits: Sequence[int]) -> list[int]:
        return list(limits)  # the drafter caps each source's rows itself (`cap`)

    def cap(self, source: str, limits: Sequence[int]) -> list[int]:
        """The caps of the rows ``source`` drafts this step (their ``limits``), from its own budget
        (none: the limits)."""
        return self.sources[source].caps(limits) if source in self.sources else list(limits)

    def routed(self, source: str, positions: list[int], drafted: int) -> None:
        """This step, ``source`` drafted the rows at ``positions`` (after `cap`), at most ``drafted`` deep."""
        if source in self.sources:
            self._routed.append((source, positions, drafted))
        else:
            self._unbudgeted = True  # rows of a source without a budget: drafted in full

    def record(self, drafted: int, accepted: Sequence[int], seconds: float) -> None:
        chosen = []
        for source, positions, depth in self._routed:
            budget = self.sources[source]
            chosen.append(budget._choice)
            budget.record(depth, [accepted[p] for p in positions], seconds)
        for name in set(self.sources) - {source for source, _, _ in self._routed}:
            self.sources[name].idle()
        self._routed = []
        # The step as a whole: full if any source drafted in full (an unbudgeted one always does),
        # plain if every budgeted source it used was plain.
        full = None in chosen or self._unbudgeted
        self.counts[FULL if full else PLAIN if all(c == 0 for c in chosen) else CAPPED] += 1
        self._unbudgeted = False

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["draft_budget"]["sources"] = {name: b.stats()["draft_budget"] for name, b in self.sources.items()}
        return out


def auto_budget() -> DraftBudget:
    """What ``draft_budget="auto"`` (the decoder's default) builds: the online rule. The test suite
    replaces it with the off budget for tests that measure the full draft's acceptance (see
    tests/conftest.py); the tests of the budget itself keep it."""
    return OnlineDraftBudget()


def resolve_budget(draft_budget: Any) -> DraftBudget:
    """The decoder's budget from its ``draft_budget`` argument: "auto" (`auto_budget`), None or
    False (off: always the full draft), or a `DraftBudget` instance."""
    if isinstance(draft_budget, DraftBudget):
        return draft_budget
    if isinstance(draft_budget, str) and draft_budget == "auto" or draft_budget is True:
        return auto_budget()
    if draft_budget is None or draft_budget is False:
        return DraftBudget()
    raise ValueError(
        f"draft_budget must be 'auto' (cap the draft online, down to plain steps, when speculation does not pay), "
        f"None (always the full draft) or a DraftBudget; got {draft_budget!r}"
    )
