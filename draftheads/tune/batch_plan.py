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
in the same interleaved rounds against the same plain decodes: a size speculates with whichever
candidate's median is higher, if it beats plain, lookup in front winning close calls (within
``LOOKUP_TIE``), and the entry records whether that was lookup.
Lookup wins where the text repeats itself or its prompt (extraction, code, lists) and costs one
n-gram search per row and step elsewhere, so it is measured, like everything else here. A tree
that drafts nothing (no tree of the heads paid for itself) has no heads-alone candidate: with
``try_lookup`` its one candidate is prompt lookup alone (the heads drafting nothing behind it).

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
#: How far the heads alone may lead and still leave prompt lookup in front: lookup is kept when its
#: median beats plain and is within this of the heads alone's. The held-out prompts plans are timed
#: on are chats the target wrote itself, which repeat little of their prompt, so they understate
#: lookup: on every benchmark of SmolLM2 heads (MT-Bench greedy, T = 0.7 and 1, Spec-Bench's other
#: categories; docs/results.md) lookup in front beat the same heads alone, while the plan's
#: verdicts between the two sat within about 0.1 of each other, in both directions.
LOOKUP_TIE = 0.1
LOOKUP = "lookup"  # the tree behind prompt lookup, the second candidate of ``try_lookup``
MIN_PAIRS = 3  # a time bound (max_seconds) never leaves a size with fewer ratios than this


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
    its plan entry will carry it."""
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
    tokens, seconds, ratios = _interleaved(decoders, batches, rounds, new_tokens, temperature, clock, sync, max_seconds)
    plan: BatchPlan = {}
    lookup: dict[int, bool] = {}
    measured: dict[int, dict[str, Any]] = {}
    for size in sizes:
        plan[size], lookup[size], measured[size] = _verdict(tokens[size], seconds[size], ratios[size], min_speedup)
        measured[size].update(cut_by_time=max_seconds is not None and measured[size]["timed_batches"] < rounds * len(batches[size]),
                              new_tokens=new_tokens)
    return BatchPlanResult(plan, measured, temperature, lookup)


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
    alone first when they were timed)."""
    candidates = list(ratios)
    plain = tokens[PLAIN] / max(seconds[PLAIN], 1e-12)
    figures = {}
    for mode in candidates:
        spec = tokens[mode] / max(seconds[mode], 1e-12)
        timed = ratios[mode]
        figures[mode] = {
            "speculative_tokens_per_second": spec,
            "plain_tokens_per_second": plain,
            "speedup": spec / plain if plain > 0 else None,
            "speedup_median": statistics.median(timed) if timed else spec / max(plain, 1e-12),
            "speedup_min": min(timed) if timed else None,
            "speedup_max": max(timed) if timed else None,
        }
    best = max(candidates, key=lambda m: figures[m]["speedup_median"])
    if LOOKUP in candidates and figures[LOOKUP]["speedup_median"] > min_speedup \
            and figures[LOOKUP]["speedup_median"] >= figures[best]["speedup_median"] - LOOKUP_TIE:
        best = LOOKUP  # a close call keeps lookup in front (LOOKUP_TIE)
    mode = SPECULATIVE if figures[best]["speedup_median"] > min_speedup else PLAIN
    behind = mode == SPECULATIVE and best == LOOKUP
    measured = {
        **figures[candidates[0]],  # the heads alone (with try_lookup, lookup in front wins ties: LOOKUP_TIE)
        "timed_batches": len(ratios[candidates[0]]),
        "min_speedup": float(min_speedup),  # the median had to exceed this for "speculative"
        "timed_seconds": sum(seconds.values()),  # warm-up excluded
    }
    if SPECULATIVE not in candidates:  # a tree that drafts nothing: lookup alone was the one candidate
        measured.update(lookup_alone=True, chosen="prompt lookup alone" if behind else "plain")
    elif LOOKUP in candidates:
        measured["prompt_lookup"] = figures[LOOKUP]
        measured["chosen"] = "heads behind prompt lookup" if behind else ("heads" if mode == SPECULATIVE else "plain")
    return mode, behind, measured


def _interleaved(decoders: dict[str, SpeculativeDecoder], batches: dict[int, list[tuple[torch.Tensor, torch.Tensor]]],
                 rounds: int, new_tokens: int, temperature: float, clock: Callable[[], float],
                 sync: Callable[[], None], max_seconds: float | None) -> tuple[dict, dict, dict]:
    """Every mode decodes every batch, the modes interleaved batch by batch with the first mode
    rotating, after one warm-up decode per mode and size. Returns per size each mode's tokens and
    seconds, and each candidate's per-batch ratios to plain."""
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

    def out_of_time(spent: dict[str, float], pairs: int) -> bool:
        """Past ``max_seconds`` of timed decoding at a size that has its ``MIN_PAIRS`` ratios."""
        return max_seconds is not None and pairs >= MIN_PAIRS and sum(spent.values()) >= max_seconds

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
                if out_of_time(seconds[size], len(ratios[size][first])):
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
