"""Spec-Bench's figures from the samples, per category and overall.

- mean accepted tokens: the mean of the per-step accepted lengths over all steps, bonus token
  included (plain decoding = 1.00 by definition);
- tokens/s: new tokens / wall time of one sample (prefill included, as the user waits for it);
- speedup: the mean per-sample tokens/s of the method divided by that of plain `generate`
  (Spec-Bench averages rates, then divides);
- per-sample speedups (same prompt, measured back to back): median and spread, which say how
  much one prompt's experience can differ from the mean;
- decode-only speedup: the same ratio of mean rates, from each sample's tokens after the first
  over the seconds after the prefill (``Sample.decode_seconds``, `clock`), over the samples
  where both the method and plain have one: prefill and the first token are the same work for
  every method, and at temperature > 0, where a method and plain sample different texts, a short
  answer's tokens/s is mostly its prefill (docs/results.md shows one such sample);
- exactness: how many outputs equal plain greedy `generate`;
- per-question speedup (``bench --rounds N``: each turn timed N times per method, interleaved
  with plain): per question (each turn of it), the method's total new tokens over its total
  seconds across the rounds, divided by the same for plain on that turn's rounds. Total over
  total is what a user who asks that prompt N times experiences, and it weighs each round by the
  time it took, so a round whose tokens differ in number (sampling) or that one slow moment
  stretched counts for its share of the time rather than as one full vote as a ratio per round
  would; at N = 1 it is the per-sample speedup. Reported per method as the median, min, q1, q3
  and max over questions (``per_question_speedup``), and per question with its per-round ratios
  and their min and max (``per_question``), which show how much of a question's spread is noise.
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from .methods import PLAIN
from .runner import Sample

OVERALL = "overall"


def spread(values: list[float]) -> dict[str, float] | None:
    """median, min, quartiles, max (None for no values)."""
    if not values:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "min": min(values), "q1": q[0], "q3": q[2], "max": max(values)}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _key(s: Sample) -> tuple:
    return (s.question_id, s.turn, s.round)


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def per_question(samples: list[Sample], plain_by_key: dict[tuple, Sample]) -> list[dict[str, Any]]:
    """One entry per (question, turn) of ``samples`` (one method's), in first-seen order: its
    speedup over the rounds (total tokens / total seconds, against plain's on the same rounds)
    and each round's own ratio of tokens/s; speedups are None where plain's rate is 0."""
    turns: dict[tuple, list[Sample]] = {}
    for s in samples:
        turns.setdefault((s.question_id, s.turn), []).append(s)
    out = []
    for (qid, turn), mine in turns.items():
        plain = [plain_by_key[_key(s)] for s in mine]
        base = _rate(sum(p.new_tokens for p in plain), sum(p.seconds for p in plain))
        rate = _rate(sum(s.new_tokens for s in mine), sum(s.seconds for s in mine))
        rounds = [s.tokens_per_second / p.tokens_per_second for s, p in zip(mine, plain) if p.tokens_per_second > 0]
        out.append({
            "question_id": qid, "category": mine[0].category, "turn": turn, "rounds": len(mine),
            "speedup": rate / base if base > 0 else None,
            "round_speedups": rounds,
            "round_min": min(rounds) if rounds else None,
            "round_max": max(rounds) if rounds else None,
        })
    return out


def _group(samples: list[Sample], plain_by_key: dict[tuple, Sample]) -> dict[str, Any]:
    rates = [s.tokens_per_second for s in samples]
    plain_rates = [plain_by_key[_key(s)].tokens_per_second for s in samples]
    steps = [a for s in samples for a in s.accept_lengths]
    is_plain = bool(samples) and samples[0].method == PLAIN
    per_sample = [r / p for r, p in zip(rates, plain_rates) if p > 0]
    exact = [s.exact for s in samples if s.exact is not None]
    base = _mean(plain_rates)
    decode = [(s.decode_tokens_per_second, plain_by_key[_key(s)].decode_tokens_per_second) for s in samples]
    decode = [(r, p) for r, p in decode if r is not None and p is not None and p > 0]
    decode_base = _mean([p for _, p in decode])
    return {
        "samples": len(samples),
        "new_tokens": sum(s.new_tokens for s in samples),
        "steps": sum(s.new_tokens for s in samples) if is_plain else len(steps),
        "mean_accepted_tokens": 1.0 if is_plain else (_mean(steps) if steps else None),
        "tokens_per_second": _mean(rates),
        "speedup": _mean(rates) / base if base > 0 else None,
        "per_sample_speedup": spread(per_sample),
        "decode_speedup": _mean([r for r, _ in decode]) / decode_base if decode_base > 0 else None,
        "per_sample_decode_speedup": spread([r / p for r, p in decode]),
        "per_question_speedup": spread([q["speedup"] for q in per_question(samples, plain_by_key)
                                        if q["speedup"] is not None]),
        "exact": None if is_plain or not exact else sum(exact),
        "exact_of": None if is_plain or not exact else len(exact),
        "budget_steps": budget_steps(samples),
    }


def budget_steps(samples: list[Sample]) -> dict[str, int] | None:
    """The draft budget's steps by mode over ``samples`` (full, capped, plain; None where no sample
    decoded speculatively): the share of plain steps says how often speculation stood aside."""
    counted = [s.stats for s in samples if "budget_plain" in (s.stats or {})]
    if not counted:
        return None
    return {mode: sum(st.get(f"budget_{mode}", 0) for st in counted) for mode in ("full", "capped", "plain")}


def accept_length_histogram(samples: list[Sample]) -> dict[int, int]:
    """How many target forwards committed 1, 2, 3, ... tokens."""
    return dict(sorted(Counter(a for s in samples for a in s.accept_lengths).items()))


def acceptance_by_depth(histogram: dict[int, int]) -> dict[int, float]:
    """Fraction of steps whose accepted path reaches tree depth d (d drafted tokens accepted,
    i.e. an accepted length of at least d + 1), for d = 1 .. the deepest seen."""
    total = sum(histogram.values())
    if not total:
        return {}
    deepest = max(histogram) - 1
    return {d: sum(n for length, n in histogram.items() if length >= d + 1) / total for d in range(1, deepest + 1)}


def summarize(samples: list[Sample], methods: list[str], categories: list[str]) -> dict[str, Any]:
    """Per method: overall and per-category figures, the accepted-length histogram, the
    acceptance rate by depth and the per-question speedups over rounds. Plain `generate` is
    included as the 1.00x reference row."""
    plain_by_key = {_key(s): s for s in samples if s.method == PLAIN}
    out: dict[str, Any] = {}
    for name in [PLAIN, *methods]:
        mine = [s for s in samples if s.method == name]
        groups = {OVERALL: _group(mine, plain_by_key)}
        for c in categories:
            in_c = [s for s in mine if s.category == c]
            if in_c:
                groups[c] = _group(in_c, plain_by_key)
        hist = accept_length_histogram(mine)
        out[name] = {
            "by_category": groups,
            "accept_length_histogram": {str(k): v for k, v in hist.items()},
            "acceptance_by_depth": {str(k): v for k, v in acceptance_by_depth(hist).items()},
            "per_question": per_question(mine, plain_by_key),
        }
    return out
