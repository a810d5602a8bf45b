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
candidate's median is higher, if it beats plain, and the entry records whether that was lookup.
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
        out = [f"batch plan ({setting}; speculative / plain tokens/s, median [min-max] over batches, interleaved):"]
        for size, m in sorted(self.measured.items()):
            out.append(
                f"  batch {size}: per batch {m['speedup_median']:.2f}x [{m['speedup_min']:.2f}-{m['speedup_max']:.2f}] "
                f"over {m['timed_batches']} batches (totals: speculative {m['speculative_tokens_per_second']:.1f}, "
                f"plain {m['plain_tokens_per_second']:.1f} tokens/s = {m['speedup']:.2f}x) -> {self.plan[size]}"
                + (" (prompt lookup alone)" if m.get("lookup_alone") else " behind prompt lookup" if self.lookup.get(size) else "")
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
    heads_draft = not tree_spec(tree).drafts_nothing
    if not heads_draft and not try_lookup:
        raise ValueError("the tree drafts nothing, so it is plain decoding: nothing to time (try_lookup times prompt "
                         "lookup alone in front of it)")
    plans = given_tree(tree, draft_vocab_size)  # the tree as its entry will run it, whatever the heads were loaded with
    decoders = {}
    if heads_draft:
        # The tree itself (no draft budget): the plan asks whether this tree beats plain decoding; the
        # budget then adapts within each generation at run time. With the budget on, its first steps
        # of a fresh decoder (the warm-up, the interleaved plain measurements) weighed on a 48-token
        # check and sent heads plain that decode at 1.1-1.5x on the retired 5M demo target (the docstring above).
        decoders[SPECULATIVE] = SpeculativeDecoder(target, heads, plans=plans, batch_plan=None, draft_budget=None,
                                                   check_model=False)
    decoders[PLAIN] = SpeculativeDecoder(target, heads, plans=plans, batch_plan={1: PLAIN}, check_model=False)
    if try_lookup:
        decoders[LOOKUP] = SpeculativeDecoder(target, heads, plans=plans, batch_plan=None, draft_budget=None,
                                              check_model=False, prompt_lookup=True)
    candidates = [m for m in decoders if m != PLAIN]
    first = candidates[0]  # the heads alone, else lookup alone: its figures are the size's own
    pad = pad_id(target, eos_ids(target, None))
    pad = 0 if pad is None else pad  # masked left padding: any id will do when the model names none
    batches = {size: prompt_batches(prompts, size, pad) for size in sizes}
    sync = (lambda: torch.cuda.synchronize(target.device)) if target.device.type == "cuda" else (lambda: None)

    def timed(mode: str, ids: torch.Tensor, mask: torch.Tensor, max_new: int, seed: int = 0) -> tuple[int, float]:
        sync()
        t0 = clock()
        out = decoders[mode].generate(ids, attention_mask=mask, max_new_tokens=max_new, temperature=temperature,
                                      eos_token_id=[], seed=seed)
        sync()
        seconds = clock() - t0
        expected = PLAIN if mode == PLAIN else SPECULATIVE
        if out.stats.get("mode") != expected:  # the plan override must route the call, or the figures mean nothing
            raise RuntimeError(f"asked for {expected} decoding but the decoder ran {out.stats.get('mode')!r}")
        return out.num_new_tokens, seconds

    def out_of_time(spent: dict[str, float], pairs: int) -> bool:
        """Past ``max_seconds`` of timed decoding at a size that has its ``MIN_PAIRS`` ratios."""
        return max_seconds is not None and pairs >= MIN_PAIRS and sum(spent.values()) >= max_seconds

    for size in sizes:  # warm-up at each shape: allocator, thread pool, lazy initialisation
        ids, mask = batches[size][0]
        for mode in decoders:
            timed(mode, ids, mask, min(8, new_tokens))
    tokens = {size: {m: 0 for m in decoders} for size in sizes}
    seconds = {size: {m: 0.0 for m in decoders} for size in sizes}
    ratios: dict[int, dict[str, list[float]]] = {size: {m: [] for m in candidates} for size in sizes}
    index = 0
    for _ in range(rounds):
        for size in sizes:
            for ids, mask in batches[size]:
                if out_of_time(seconds[size], len(ratios[size][first])):
                    continue
                modes = list(decoders)  # each mode first in turn, so none always runs on a cold or warm machine
                order = modes[index % len(modes):] + modes[: index % len(modes)]
                index += 1
                rate = {}
                for mode in order:
                    n, s = timed(mode, ids, mask, new_tokens, seed=index)
                    tokens[size][mode] += n
                    seconds[size][mode] += s
                    rate[mode] = n / s if s > 0 else 0.0
                if rate[PLAIN] > 0:
                    for mode in candidates:
                        ratios[size][mode].append(rate[mode] / rate[PLAIN])
    plan: BatchPlan = {}
    lookup: dict[int, bool] = {}
    measured: dict[int, dict[str, Any]] = {}
    for size in sizes:
        plain = tokens[size][PLAIN] / max(seconds[size][PLAIN], 1e-12)
        figures = {}
        for mode in candidates:
            spec = tokens[size][mode] / max(seconds[size][mode], 1e-12)
            timed_ratios = ratios[size][mode]
            figures[mode] = {
                "speculative_tokens_per_second": spec,
                "plain_tokens_per_second": plain,
                "speedup": spec / plain if plain > 0 else None,
                "speedup_median": statistics.median(timed_ratios) if timed_ratios else spec / max(plain, 1e-12),
                "speedup_min": min(timed_ratios) if timed_ratios else None,
                "speedup_max": max(timed_ratios) if timed_ratios else None,
            }
        best = max(candidates, key=lambda m: figures[m]["speedup_median"])  # the heads alone on a tie
        plan[size] = SPECULATIVE if figures[best]["speedup_median"] > min_speedup else PLAIN
        lookup[size] = plan[size] == SPECULATIVE and best == LOOKUP
        timed_batches = len(ratios[size][first])
        measured[size] = {
            **figures[first],  # the heads alone (with try_lookup the better median of the two decides)
            "timed_batches": timed_batches,
            "cut_by_time": max_seconds is not None and timed_batches < rounds * len(batches[size]),
            "new_tokens": new_tokens,
            "min_speedup": float(min_speedup),  # the median had to exceed this for "speculative"
            "timed_seconds": sum(seconds[size].values()),  # warm-up excluded
        }
        if not heads_draft:
            measured[size]["lookup_alone"] = True
            measured[size]["chosen"] = "prompt lookup alone" if lookup[size] else "plain"
        elif try_lookup:
            measured[size]["prompt_lookup"] = figures[LOOKUP]
            measured[size]["chosen"] = "heads behind prompt lookup" if lookup[size] else (
                "heads" if plan[size] == SPECULATIVE else "plain")
    return BatchPlanResult(plan, measured, temperature, lookup)
