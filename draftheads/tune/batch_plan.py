"""`draftheads calibrate --batch-sizes`: at which batch sizes does speculation still pay here?

A verify forward over B rows x n tree tokens costs about what B x n plain tokens cost once the
device is busy (a CPU at batch 4 already is), so the gain of speculation shrinks as the batch
grows and turns into a loss. The answer depends on the device, the target and the heads'
acceptance, so it is measured: for every batch size, left-padded batches built from the
calibration prompts are decoded (greedily, or sampled at the plan's temperature with one seed
per batch for both modes) with the chosen tree and with plain decoding (the
target's `generate`, what the decoder runs for a batch the plan marks plain), the two modes
interleaved batch by batch and their order alternated, over ``rounds`` rounds. Speculation is
the plan's answer for a size when the median over batches of its tokens/s ratio to plain exceeds
``PLAIN_MARGIN`` (1.0): a median, not total tokens / total seconds, because on a shared machine
one slow moment in one run can swing the totals (seen here: totals 0.42x against a per-batch
median of 0.82x). The tree is timed without the draft budget, and no margin is added on top:
at run time the online budget takes plain steps wherever drafting stops paying, so a tree at
parity costs little, while the 5% margin this used to ask, on a check of a few short prompts,
sent heads plain that decode at 1.1-1.5x on longer ones ("Training's plans" in `git show 19f3628:benchmarks/README.md`).

With ``try_lookup`` the same tree behind prompt lookup (`inference.proposers.hybrid`: a row whose
text repeats an earlier n-gram drafts the copy, the heads the others) is a second candidate, timed
in the same interleaved rounds against the same plain decodes. A tree that drafts nothing (no tree
of the heads paid for itself) has no heads-alone candidate: with ``try_lookup`` its one candidate
is prompt lookup alone (the heads drafting nothing behind it).

**Keeping lookup in front weighs its downside against its upside** (`_keeps_lookup`). Its upside
is the copies it drafts where the text repeats (extraction, code, rewriting, lists: 1.7x on
MT-Bench on a 2-core EPYC); its downside, where nothing repeats, is one n-gram search per row and
step: a few microseconds (measured here, ``lookup_search_seconds``) against a step of tens of
milliseconds, far below what timing resolves. So lookup is not asked to WIN on prompts that may
repeat little: it stays in front unless it measured slower than its alternative (the heads alone
where they beat plain, else plain) by more than ``LOOKUP_RESOLUTION`` with 95% confidence (the
paired per-batch ratios, `ratio_interval`).

**Enough timed runs to separate small differences**: with ``resolution`` (training's plans pass
it) a size keeps timing pairs until every comparison its verdict rests on is settled (its 95%
interval excludes the threshold, or is narrower than ``resolution`` either side) or its time bound
is spent, instead of stopping after a fixed few; the figures say how many pairs and the interval.

Training's tree choice runs the same measurement at batch size 1 per temperature (a few held-out
rows), so "plain where the tree loses to ``generate``" means one thing in both places.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..inference.decoder import SpeculativeDecoder
from ..inference.inputs import eos_ids, left_pad, pad_id
from ..plans import PLAIN, SPECULATIVE, BatchPlan, TreeSpec, given_tree, tree_spec

PLAIN_MARGIN = 1.0  # the tree must beat plain decoding (median per-batch ratio), else plain
#: Lookup in front is dropped only when measured slower than its alternative by more than this
#: (the upper end of the 95% interval of its paired ratio below 1 - LOOKUP_RESOLUTION): its own cost
#: where nothing repeats, a few microseconds of search per step, is far below it (module docstring).
LOOKUP_RESOLUTION = 0.01
LOOKUP = "lookup"  # the tree behind prompt lookup, the second candidate of ``try_lookup``
MIN_PAIRS = 3  # a time bound (max_seconds) never leaves a size with fewer ratios than this
#: Two-sided 95% quantiles of Student's t by degrees of freedom (the rest: the normal's 1.96).
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04}


def ratio_interval(ratios: list[float]) -> tuple[float, float]:
    """The 95% interval of the geometric mean of ``ratios`` (timings are multiplicative: the mean
    of their logs, Student's t); (0, inf) for fewer than two."""
    logs = [math.log(r) for r in ratios if r > 0]
    if len(logs) < 2:
        return 0.0, math.inf
    mean, spread = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    df = len(logs) - 1
    t = next((v for k, v in sorted(_T95.items()) if k >= df), 1.96)
    return math.exp(mean - t * spread), math.exp(mean + t * spread)


def _settled(ratios: list[float], threshold: float, resolution: float) -> bool:
    """Whether more pairs could change a comparison of ``ratios`` with ``threshold``: no, once
    its interval excludes the threshold or is narrower than ``resolution`` either side."""
    lo, hi = ratio_interval(ratios)
    return lo > threshold or hi < threshold or (hi / lo) ** 0.5 < 1 + resolution


def _keeps_lookup(lookup: list[float], alternative: list[float]) -> bool:
    """The rule for lookup in front (module docstring): kept unless its per-batch ratios, paired
    with the alternative's, are slower by more than ``LOOKUP_RESOLUTION`` with 95% confidence."""
    relative = [a / b for a, b in zip(lookup, alternative) if b > 0]
    return ratio_interval(relative)[1] >= 1 - LOOKUP_RESOLUTION


def lookup_search_seconds(history: int = 256, steps: int = 200) -> float:
    """Median seconds of one prompt-lookup step (a search that finds nothing, then committing the
    token) over a ``history``-token text that never repeats: what lookup in front costs a row
    where its text does not repeat."""
    from ..inference.proposers.prompt_lookup import PromptLookupProposer
    from ..inference.sampling import SamplingParams

    lookup = PromptLookupProposer()
    lookup.start(torch.arange(history)[None], None, SamplingParams(), None)
    samples = []
    for i in range(steps):
        t0 = time.perf_counter()
        lookup.propose(history + i, 10)
        lookup.accepted(torch.tensor([history + i]))
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def prompt_batches(prompts: list[torch.Tensor], size: int, pad_id: int, min_batches: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive groups of ``size`` prompts, wrapping around, at least ``min_batches`` of them
    (so that even the largest size is timed on more than one batch per round)."""
    count = max(min_batches, -(-len(prompts) // size))
    return [left_pad([prompts[(b * size + i) % len(prompts)] for i in range(size)], pad_id) for b in range(count)]


@dataclass
class BatchPlanResult:
    """The mode per batch size, what decided it, and (``lookup``) the sizes that speculate behind
    prompt lookup."""

    plan: BatchPlan
    measured: dict[int, dict[str, Any]] = field(default_factory=dict)
    temperature: float = 0.0
    lookup: dict[int, bool] = field(default_factory=dict)

    def lines(self) -> list[str]:
        setting = "greedy" if self.temperature == 0 else f"temperature {self.temperature:g}"
        alone = any(m.get("lookup_alone") for m in self.measured.values())
        timed = "prompt lookup alone (the tree drafts nothing)" if alone else "speculative"
        out = [f"batch plan ({setting}; {timed} / plain tokens/s, median [min-max] over batches, interleaved):"]
        for size, m in sorted(self.measured.items()):
            out.append(
                f"  batch {size}: per batch {m['speedup_median']:.2f}x [{m['speedup_min']:.2f}-{m['speedup_max']:.2f}] "
                f"over {m['timed_batches']} batches (totals: speculative {m['speculative_tokens_per_second']:.1f}, "
                f"plain {m['plain_tokens_per_second']:.1f} tokens/s = {m['speedup']:.2f}x) -> {self.plan[size]}"
                + (" by prompt lookup alone" if self.lookup.get(size) and m.get("lookup_alone")
                   else " behind prompt lookup" if self.lookup.get(size) else "")
                + f" (speculative needs > {m['min_speedup']:.2f}x)"
            )
            behind = m.get("prompt_lookup")
            if behind:
                out.append(f"    behind prompt lookup: per batch {behind['speedup_median']:.2f}x "
                           f"[{behind['speedup_min']:.2f}-{behind['speedup_max']:.2f}]")
            against = m.get("lookup_vs")
            if against:
                lo, hi = against["interval"]
                share = m.get("lookup_search_share")
                cost = f"; its search costs {share * 100:.3f}% of a step where nothing repeats" if share else ""
                out.append(f"    lookup against {against['against']}: 95% interval {lo:.3f}-"
                           f"{'inf' if hi is None else f'{hi:.3f}'}x, kept unless below "
                           f"{against['kept_unless_below']:.2f}{cost}")
        return out


def _check_positive(value: Any, name: str, hint: str) -> None:
    """A threshold or bound that can be met: a finite number > 0 (a string or NaN would compare
    wrongly or never, and silently make every size plain, speculative or untimed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 ({hint}), got {value!r}")


@torch.inference_mode()
def measure_batch_plan(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    tree: TreeSpec | list[list[int]] | dict,
    prompts: list[torch.Tensor],
    batch_sizes: list[int],
    new_tokens: int = 64,
    rounds: int = 2,
    temperature: float = 0.0,
    min_speedup: float = PLAIN_MARGIN,
    clock: Callable[[], float] = time.perf_counter,
    max_seconds: float | None = None,
    try_lookup: bool = False,
    draft_vocab_size: int | None = None,
    resolution: float | None = None,
    max_seconds_by_size: dict[int, float] | None = None,
) -> BatchPlanResult:
    """Time speculative decoding with ``tree`` against plain decoding at every batch size (see the
    module docstring), at ``temperature`` (0: greedy), and return the plan with its measurements.

    ``min_speedup``: the median ratio speculation must exceed to be the plan's answer (1: merely
    faster than plain). ``clock``: the timer (seconds), replaceable so that a
    test can script the timings and check the rule itself. ``max_seconds``: a bound on the timed
    decoding per batch size (warm-up excluded): once it is spent, no further pair of decodes starts
    at that size, but a size always gets ``MIN_PAIRS`` pairs (or all its batches, if fewer). On a
    loaded machine every decode stretches, and a training run must not wait minutes for this.
    ``try_lookup``: also time the tree behind prompt lookup (module docstring); the measured figures
    at a size are the heads alone's, with the lookup candidate's under ``prompt_lookup``.
    ``draft_vocab_size``: the static tree's draft vocabulary (None: the whole vocabulary), as
    its plan entry will carry it. ``resolution`` (e.g. 0.01): stop timing a size early once its
    verdict's comparisons are settled to that (module docstring); None: every batch of every
    round. ``max_seconds_by_size``: a bound per batch size, where it differs from ``max_seconds``."""
    if max_seconds is not None:
        _check_positive(max_seconds, "max_seconds", "None = no bound")
    _check_positive(min_speedup, "min_speedup", "1 = merely faster than plain")
    if not prompts:
        raise ValueError("no prompts to build batches from")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    sizes = sorted(set(batch_sizes))
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ValueError(f"batch sizes must be whole numbers >= 1, got {batch_sizes!r}")
    decoders = _decoders(target, heads, tree, draft_vocab_size, try_lookup)
    pad = pad_id(target, eos_ids(target, None))
    pad = 0 if pad is None else pad  # masked left padding: any id will do when the model names none
    batches = {size: prompt_batches(prompts, size, pad) for size in sizes}
    sync = (lambda: torch.cuda.synchronize(target.device)) if target.device.type == "cuda" else (lambda: None)
    bounds = {size: (max_seconds_by_size or {}).get(size, max_seconds) for size in sizes}
    for bound in bounds.values():
        if bound is not None:
            _check_positive(bound, "max_seconds_by_size", "None = no bound")
    done = (lambda r: _all_settled(r, min_speedup, resolution)) if resolution else None
    tokens, seconds, ratios = _interleaved(decoders, batches, rounds, new_tokens, temperature, clock, sync, bounds, done)
    search = lookup_search_seconds() if try_lookup else None
    plan: BatchPlan = {}
    lookup: dict[int, bool] = {}
    measured: dict[int, dict[str, Any]] = {}
    for size in sizes:
        plan[size], lookup[size], measured[size] = _verdict(tokens[size], seconds[size], ratios[size], min_speedup)
        timed = measured[size]["timed_batches"]
        measured[size].update(cut_by_time=bounds[size] is not None and timed < rounds * len(batches[size])
                              and not (done and done(ratios[size])), new_tokens=new_tokens)
        if resolution:
            measured[size].update(resolution=resolution, settled=bool(done(ratios[size])))
        if search is not None and tokens[size][PLAIN]:
            measured[size]["lookup_search_seconds"] = search  # per row and step, where nothing repeats
            measured[size]["lookup_search_share"] = search / (seconds[size][PLAIN] / tokens[size][PLAIN])
    return BatchPlanResult(plan, measured, temperature, lookup)


def _all_settled(ratios: dict[str, list[float]], min_speedup: float, resolution: float) -> bool:
    """Whether every comparison a size's verdict rests on is settled (`_settled`): each candidate
    against ``min_speedup``, and lookup in front against the heads alone."""
    if any(not _settled(r, min_speedup, resolution) for r in ratios.values()):
        return False
    if LOOKUP in ratios and SPECULATIVE in ratios:
        relative = [a / b for a, b in zip(ratios[LOOKUP], ratios[SPECULATIVE]) if b > 0]
        return _settled(relative, 1 - LOOKUP_RESOLUTION, resolution)
    return True


def _decoders(target: torch.nn.Module, heads: torch.nn.Module, tree: Any, draft_vocab_size: int | None,
              try_lookup: bool) -> dict[str, SpeculativeDecoder]:
    """One decoder per mode timed: the heads alone (unless ``tree`` drafts nothing), plain
    decoding, and with ``try_lookup`` the heads behind prompt lookup; each runs ``tree`` with its
    draft vocabulary as its plan entry will, whatever plans the heads were loaded with."""
    heads_draft = not tree_spec(tree).drafts_nothing
    if not heads_draft and not try_lookup:
        raise ValueError("the tree drafts nothing, so it is plain decoding: nothing to time (try_lookup times prompt "
                         "lookup alone in front of it)")
    plans = given_tree(tree, draft_vocab_size)
    decoders = {}
    if heads_draft:
        # The tree itself (no draft budget): the plan asks whether this tree beats plain decoding; the
        # budget then adapts within each generation at run time. With the budget on, its first steps
        # of a fresh decoder (the warm-up, the interleaved plain measurements) weighed on a 48-token
        # check and sent heads plain that decode at 1.1-1.5x on the retired 5M demo target (the module docstring).
        decoders[SPECULATIVE] = SpeculativeDecoder(target, heads, plans=plans, batch_plan=None, draft_budget=None,
                                                   check_model=False)
    decoders[PLAIN] = SpeculativeDecoder(target, heads, plans=plans, batch_plan={1: PLAIN}, check_model=False)
    if try_lookup:
        decoders[LOOKUP] = SpeculativeDecoder(target, heads, plans=plans, batch_plan=None, draft_budget=None,
                                              check_model=False, prompt_lookup=True)
    return decoders


def _verdict(tokens: dict[str, int], seconds: dict[str, float], ratios: dict[str, list[float]],
             min_speedup: float) -> tuple[str, bool, dict[str, Any]]:
    """One batch size's mode, whether it speculates behind prompt lookup, and its figures, from
    each mode's totals and each candidate's per-batch ratios to plain (``ratios``' keys, the heads
    alone first when they were timed). The heads alone speculate where their median beats
    ``min_speedup``; lookup in front is then kept against that choice (the heads alone, or plain)
    unless measured slower than it (`_keeps_lookup`)."""
    candidates = list(ratios)
    plain = tokens[PLAIN] / max(seconds[PLAIN], 1e-12)
    figures = {}
    for mode in candidates:
        spec = tokens[mode] / max(seconds[mode], 1e-12)
        timed = ratios[mode]
        lo, hi = ratio_interval(timed)
        figures[mode] = {
            "speculative_tokens_per_second": spec,
            "plain_tokens_per_second": plain,
            "speedup": spec / plain if plain > 0 else None,
            "speedup_median": statistics.median(timed) if timed else spec / max(plain, 1e-12),
            "speedup_min": min(timed) if timed else None,
            "speedup_max": max(timed) if timed else None,
            "speedup_interval": [lo, hi if math.isfinite(hi) else None],  # 95%, of the geometric mean
        }
    heads = SPECULATIVE in candidates and figures[SPECULATIVE]["speedup_median"] > min_speedup
    behind = False
    if LOOKUP in candidates:
        n = len(ratios[LOOKUP])
        alternative = ratios[SPECULATIVE] if heads else [1.0] * n  # plain: 1.0 against itself
        behind = n > 0 and _keeps_lookup(ratios[LOOKUP], alternative)
    mode = SPECULATIVE if heads or behind else PLAIN
    measured = {
        **figures[candidates[0]],  # the heads alone, or lookup alone where the tree drafts nothing
        "timed_batches": len(ratios[candidates[0]]),
        "min_speedup": float(min_speedup),  # the heads' median had to exceed this for "speculative"
        "timed_seconds": sum(seconds.values()),  # warm-up excluded
    }
    if SPECULATIVE not in candidates:  # a tree that drafts nothing: lookup alone was the one candidate
        measured.update(lookup_alone=True, chosen="prompt lookup alone" if behind else "plain")
    elif LOOKUP in candidates:
        measured["prompt_lookup"] = figures[LOOKUP]
        measured["chosen"] = "heads behind prompt lookup" if behind else ("heads" if mode == SPECULATIVE else "plain")
    if LOOKUP in candidates and ratios[LOOKUP]:
        alternative = ratios[SPECULATIVE] if heads else [1.0] * len(ratios[LOOKUP])
        lo, hi = ratio_interval([a / b for a, b in zip(ratios[LOOKUP], alternative) if b > 0])
        measured["lookup_vs"] = {"against": "heads alone" if heads else "plain", "interval": [lo, hi if math.isfinite(hi) else None],
                                 "kept_unless_below": 1 - LOOKUP_RESOLUTION}
    return mode, behind, measured


def _interleaved(decoders: dict[str, SpeculativeDecoder], batches: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
                 rounds: int, new_tokens: int, temperature: float, clock: Callable[[], float],
                 sync: Callable[[], None], max_seconds: dict[int, float | None],
                 settled: Callable[[dict[str, list[float]]], bool] | None = None) -> tuple[dict, dict, dict]:
    """Every mode decodes every batch, the modes interleaved batch by batch with the first mode
    rotating, after one warm-up decode per mode and size. A size stops early once ``settled``
    says its ratios need no more pairs (after ``MIN_PAIRS``), or when its time bound is spent.
    Returns per size each mode's tokens and seconds, and each candidate's per-batch ratios to
    plain."""
    candidates = [m for m in decoders if m != PLAIN]
    first = candidates[0]  # the heads alone, else lookup alone: its ratios count the size's pairs

    def timed(mode: str, ids: torch.Tensor, mask: torch.Tensor, max_new: int, seed: int = 0) -> tuple[int, float]:
        sync()
        t0 = clock()
        out = decoders[mode].generate(ids, attention_mask=mask, max_new_tokens=max_new, temperature=temperature,
                                      eos_token_id=[], seed=seed)
        sync()
        spent = clock() - t0
        expected = PLAIN if mode == PLAIN else SPECULATIVE
        if out.stats.get("mode") != expected:  # the plan override must route the call, or the figures mean nothing
            raise RuntimeError(f"asked for {expected} decoding but the decoder ran {out.stats.get('mode')!r}")
        return out.num_new_tokens, spent

    def stop(size: int, spent: dict[str, float], done: dict[str, list[float]]) -> bool:
        """Enough at ``size``: its ``MIN_PAIRS`` ratios and either settled or past its time bound."""
        pairs = len(done[first])
        if pairs < MIN_PAIRS:
            return False
        bound = max_seconds.get(size)
        return (bound is not None and sum(spent.values()) >= bound) or (settled is not None and settled(done))

    for size, size_batches in batches.items():  # warm-up at each shape: allocator, thread pool, lazy initialisation
        ids, mask = size_batches[0]
        for mode in decoders:
            timed(mode, ids, mask, min(8, new_tokens))
    tokens = {size: {m: 0 for m in decoders} for size in batches}
    seconds = {size: {m: 0.0 for m in decoders} for size in batches}
    ratios: dict[int, dict[str, list[float]]] = {size: {m: [] for m in candidates} for size in batches}
    index = 0
    for _ in range(rounds):
        for size, size_batches in batches.items():
            for ids, mask in size_batches:
                if stop(size, seconds[size], ratios[size]):
                    continue
                modes = list(decoders)  # each mode first in turn, so none always runs on a cold or warm machine
                order = modes[index % len(modes):] + modes[: index % len(modes)]
                index += 1
                rate = {}
                for mode in order:
                    n, spent = timed(mode, ids, mask, new_tokens, seed=index)
                    tokens[size][mode] += n
                    seconds[size][mode] += spent
                    rate[mode] = n / spent if spent > 0 else 0.0
                if rate[PLAIN] > 0:
                    for mode in candidates:
                        ratios[size][mode].append(rate[mode] / rate[PLAIN])
    return tokens, seconds, ratios
