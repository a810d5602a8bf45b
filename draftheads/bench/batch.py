"""`draftheads bench --batch-size 1,4,8`: tokens/s of every method against plain batched `generate`
at the same batch size, in one run.

Prompts are grouped into left-padded batches of each size. Every batch runs plain `generate`
and each method back to back, in an order that rotates from batch to batch (as the per-question
runner does), so a slow minute on a shared machine slows all of them alike. The figure per batch
is the ratio of tokens/s to plain's on that batch; the report gives its median and spread.

With ``rounds`` = N every batch is timed N times the same way (the rotation continues from round
to round; round r of the k-th batch, counted over all sizes, uses seed ``seed + k * N + r`` for plain
and every method, ``seed + k`` at N = 1), and a batch's figure is the methods' total new tokens over
total seconds across its rounds, against plain's: what N repeats of that batch cost, each round
weighed by its time (see metrics.py). At temperature 0 every round is checked against that
round's plain output.
"""
from __future__ import annotations

import statistics
import sys
from typing import Any

import torch

from ..inference.inputs import left_pad
from .clock import timed
from .methods import PLAIN, Method
from .runner import encode_turn, fit_context


def new_token_count(sequences: torch.Tensor, width: int, eos: set[int], pad_id: int) -> int:
    """Tokens generated (up to and including each row's EOS; the padding after it not counted)."""
    total = 0
    for row in sequences[:, width:].tolist():
        n = len(row)
        for i, tok in enumerate(row):
            if tok in eos:
                n = i + 1
                break
        total += n
    return total


def batches_of(prompts: list[torch.Tensor], size: int, max_batches: int | None) -> list[list[torch.Tensor]]:
    """Consecutive groups of ``size`` prompts (wrapping around when there are fewer prompts)."""
    count = max(1, len(prompts) // size) if max_batches is None else max_batches
    return [[prompts[(b * size + i) % len(prompts)] for i in range(size)] for b in range(count)]


class BatchBench:
    def __init__(self, target, tokenizer, methods: list[Method], max_new_tokens: int, temperature: float, seed: int,
                 use_chat_template: bool) -> None:
        self.target, self.tokenizer, self.methods = target, tokenizer, methods
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.use_chat_template = use_chat_template
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else tokenizer.eos_token_id
        eos = getattr(target.generation_config, "eos_token_id", None)
        self.eos = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))

    def prompts(self, questions) -> list[torch.Tensor]:
        from .runner import context_limit

        limit = context_limit(self.target)
        return [fit_context(encode_turn(self.tokenizer, q, 0, [], self.use_chat_template), self.max_new_tokens, limit)[0][0]
                for q in questions]

    def _plain(self, ids, mask, seed: int | None = None):
        sampling = {"do_sample": False} if self.temperature == 0 else {
            "do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}
        if self.temperature > 0 and seed is not None:
            torch.manual_seed(seed)
        return self.target.generate(ids.to(self.target.device), attention_mask=mask.to(self.target.device),
                                    max_new_tokens=self.max_new_tokens, pad_token_id=self.pad_id, **sampling).cpu()

    def _method(self, method: Method, ids, mask, seed: int):
        return method.decoder.generate(ids, attention_mask=mask, max_new_tokens=self.max_new_tokens,
                                       temperature=self.temperature, top_k=0, top_p=1.0,
                                       generator=torch.Generator().manual_seed(seed), acceptance=method.acceptance)

    def _round(self, ids, mask, index: int, rnd: int) -> dict[str, Any]:
        """One timed round of one batch: plain and every method back to back, in the order ``index``
        (the count of rounds timed so far) rotates to, all with seed ``self.seed + index``."""
        seed = self.seed + index
        order = [PLAIN] + [m.name for m in self.methods]
        shift = index % len(order)
        order = order[shift:] + order[:shift]
        results = {}
        for name in order:
            if name == PLAIN:
                results[name] = timed(self.target, self._plain, ids, mask, seed)
            else:
                method = next(m for m in self.methods if m.name == name)
                results[name] = timed(self.target, self._method, method, ids, mask, seed)
        rows = ids.shape[0]  # every row's first token comes with the prefill
        reference, seconds, decode_seconds = results[PLAIN]
        new_tokens = new_token_count(reference, ids.shape[1], self.eos, self.pad_id)
        run = {PLAIN: {"seconds": seconds, "new_tokens": new_tokens, "decode_seconds": decode_seconds,
                       "decode_tokens": new_tokens - rows, "round": rnd, "seed": seed}}
        for m in self.methods:
            out, seconds, decode_seconds = results[m.name]
            run[m.name] = {
                "seconds": seconds, "new_tokens": out.num_new_tokens,
                "decode_seconds": decode_seconds, "decode_tokens": out.num_new_tokens - rows,
                "mean_accept_length": out.mean_accept_length,
                "mode": out.stats.get("mode"),  # "plain" where the method's batch plan says so
                "exact": bool(torch.equal(out.sequences, reference)) if self.temperature == 0 else None,
                "round": rnd, "seed": seed,
            }
        return run

    def run(self, questions, batch_sizes: list[int], max_batches: int | None, warmup: int,
            progress: bool = True, rounds: int = 1) -> dict[str, Any]:
        if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
            raise ValueError(f"rounds must be a whole number >= 1, got {rounds!r}")
        prompts = self.prompts(questions)
        table: dict[str, Any] = {}
        index = 0
        with torch.inference_mode():
            for size in batch_sizes:
                groups = batches_of(prompts, size, max_batches)
                for _ in range(warmup):  # untimed: lazy initialisation at this shape
                    ids, mask = left_pad(groups[0], self.pad_id)
                    self._plain(ids, mask)
                    for m in self.methods:
                        self._method(m, ids, mask, self.seed)
                runs: list[dict[str, Any]] = []
                for group in groups:
                    ids, mask = left_pad(group, self.pad_id)
                    for rnd in range(rounds):
                        runs.append(self._round(ids, mask, index, rnd))
                        index += 1
                        if progress:
                            print(f"batch {size}: {len(runs)}/{len(groups) * rounds} " + _ratios_line(runs, self.methods),
                                  file=sys.stderr)
                table[str(size)] = summarize_batch(runs, [m.name for m in self.methods], rounds)
        return table


def _tps(entry: dict[str, Any]) -> float:
    return entry["new_tokens"] / entry["seconds"] if entry["seconds"] > 0 else 0.0


def _ratios_line(runs, methods) -> str:
    return ", ".join(
        f"{m.name} {statistics.median(_tps(r[m.name]) / _tps(r[PLAIN]) for r in runs):.2f}x" for m in methods
    )


def _total_tps(entries: list[dict[str, Any]]) -> float:
    seconds = sum(e["seconds"] for e in entries)
    return sum(e["new_tokens"] for e in entries) / seconds if seconds > 0 else 0.0


def _total_decode_tps(entries: list[dict[str, Any]]) -> float | None:
    """Tokens after each row's first over the seconds after the prefill, summed over ``entries``
    (None where one has no decode timing: reports from before it, or nothing decoded)."""
    if any(e.get("decode_seconds") is None for e in entries):
        return None
    seconds = sum(e["decode_seconds"] for e in entries)
    tokens = sum(e["decode_tokens"] for e in entries)
    return tokens / seconds if seconds > 0 and tokens > 0 else None


def summarize_batch(runs: list[dict[str, Any]], names: list[str], rounds: int = 1) -> dict[str, Any]:
    """Per method at one batch size: tokens/s (median over timed runs), the per-batch ratio to plain
    (median, min, max over batches; a batch's ratio is total tokens / total seconds over its
    ``rounds`` consecutive runs, against plain's), each batch's ratio with its per-round ratios
    and their min and max (``per_batch``), the same ratio for decoding alone (``decode_speedup_*``:
    the tokens after each row's first over the seconds after the prefill, `clock`), mean accepted
    tokens per row-step, and whether every run was exact."""
    if len(runs) % rounds:
        raise ValueError(f"{len(runs)} runs are not whole batches of {rounds} rounds")
    batches = [runs[b:b + rounds] for b in range(0, len(runs), rounds)]
    out: dict[str, Any] = {"batches": len(batches), "rounds": rounds,
                           PLAIN: {"tokens_per_second": statistics.median(_tps(r[PLAIN]) for r in runs)}}
    for name in names:
        per_batch = []
        for b in batches:
            base = _total_tps([r[PLAIN] for r in b])
            round_ratios = [_tps(r[name]) / _tps(r[PLAIN]) for r in b if _tps(r[PLAIN]) > 0]
            decode_base, decode = _total_decode_tps([r[PLAIN] for r in b]), _total_decode_tps([r[name] for r in b])
            per_batch.append({
                "speedup": _total_tps([r[name] for r in b]) / base if base > 0 else None,
                "decode_speedup": decode / decode_base if decode and decode_base else None,
                "round_speedups": round_ratios,
                "round_min": min(round_ratios) if round_ratios else None,
                "round_max": max(round_ratios) if round_ratios else None,
            })
        ratios = [x["speedup"] for x in per_batch if x["speedup"] is not None]
        decode_ratios = [x["decode_speedup"] for x in per_batch if x["decode_speedup"] is not None]
        exact = [r[name]["exact"] for r in runs if r[name]["exact"] is not None]
        out[name] = {
            "tokens_per_second": statistics.median(_tps(r[name]) for r in runs),
            "speedup_median": statistics.median(ratios) if ratios else None,
            "speedup_min": min(ratios) if ratios else None,
            "speedup_max": max(ratios) if ratios else None,
            "decode_speedup_median": statistics.median(decode_ratios) if decode_ratios else None,
            "decode_speedup_min": min(decode_ratios) if decode_ratios else None,
            "decode_speedup_max": max(decode_ratios) if decode_ratios else None,
            "mean_accept_length": statistics.fmean(r[name]["mean_accept_length"] for r in runs),
            "all_exact": all(exact) if exact else None,
            "modes": sorted({r[name].get("mode") for r in runs if r[name].get("mode")}),
            "per_batch": per_batch,
        }
    out["runs"] = runs
    return out


def batch_markdown(table: dict[str, Any], names: list[str], planned: list[str] | tuple = ()) -> str:
    """The batch table: one row per batch size and method; a method in ``planned`` (its decoder has
    a batch plan) is shown with the mode it ran at that size, e.g. ``medusa (plain)``."""
    lines = ["| batch | method | tokens/s | vs plain (median [min-max]) | decoding alone | accepted/step | exact |",
             "|---:|---|---:|---|---|---:|---|"]
    for size, res in table.items():
        lines.append(f"| {size} | plain generate | {res[PLAIN]['tokens_per_second']:.1f} | 1.00x | 1.00x | 1.00 | |")
        for name in names:
            r = res[name]
            exact = "" if r["all_exact"] is None else ("yes" if r["all_exact"] else "NO")
            label = f"{name} ({'/'.join(r.get('modes') or ['?'])})" if name in planned else name
            lines.append(f"| {size} | {label} | {r['tokens_per_second']:.1f} | {_ratio(r, 'speedup')} | "
                         f"{_ratio(r, 'decode_speedup')} | {r['mean_accept_length']:.2f} | {exact} |")
    return "\n".join(lines)


def _ratio(r: dict[str, Any], key: str) -> str:
    """``median [min-max]`` of a ratio over batches; n/a where there is none (``decode_speedup``
    is missing from reports written before it was measured)."""
    if r.get(f"{key}_median") is None:
        return "n/a"
    return f"{r[f'{key}_median']:.2f}x [{r[f'{key}_min']:.2f}-{r[f'{key}_max']:.2f}]"
