"""`draftheads demo`: what the heads' plan does on this machine, shown on a few prompts of
different kinds: plain `generate`, the plan (``SpeculativeDecoder(target, heads)``, as a user
decodes) and prompt lookup alone, interleaved per prompt, in one small table (tokens/s, tokens
per target step, and whether the output equals `generate`), then one line on why the plan is what
it is (`tune.explain.why`: the cost curve and what the timing measured).

The prompts are the first turns of a few evaluation questions of different categories (MT-Bench
for a chat model; the ``text`` set for a base model): a demonstration, not a tuning set, so the
evaluation questions are the right ones to show. ``make demo`` ends with it.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable

from ..arguments import positive_int

if TYPE_CHECKING:
    import torch
from .questions import load_questions, select

DEMO_CATEGORIES = ("writing", "extraction", "coding", "reasoning", "humanities")
MODES = ("plain", "plan", "lookup alone")


def add_parser(sub, add_target_args: Callable) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="plain vs the heads' plan vs prompt lookup alone on a few prompts, and why")
    add_target_args(p)
    p.add_argument("--heads", required=True, help="heads folder")
    p.add_argument("--questions", default=None, metavar="NAME_OR_FILE",
                   help="default: mt-bench for a chat model (one question per category), text for a base model")
    p.add_argument("--num-prompts", type=positive_int, default=len(DEMO_CATEGORIES))
    p.add_argument("--max-new-tokens", type=positive_int, default=96)
    p.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads")
    return p


def _prompts(args, tokenizer) -> list[tuple[str, "torch.Tensor"]]:
    from .runner import encode_turn

    chat = bool(getattr(tokenizer, "chat_template", None)) and not args.no_chat_template
    source = args.questions or ("mt-bench" if chat else "text")
    questions = load_questions(source)
    if source == "mt-bench":
        by_category = {q.category: q for q in reversed(questions)}
        chosen = [by_category[c] for c in DEMO_CATEGORIES if c in by_category][: args.num_prompts]
    else:
        chosen = select(questions, None, args.num_prompts)
    return [(q.category, encode_turn(tokenizer, q, 0, [], chat)) for q in chosen]


def run_demo(args, load_target: Callable) -> int:
    import torch

    import draftheads as dh

    from ..arguments import heads_error
    from ..device import device_name
    from ..tune.explain import why

    if args.threads:
        torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target)
    try:
        heads = dh.load_heads(args.heads, target=target, check_fingerprint=not args.no_fingerprint_check)
    except (ValueError, OSError) as e:  # missing, corrupt, another target's: one error line (cli.main)
        raise heads_error(args.heads, e) from None
    decoders = {"plan": dh.SpeculativeDecoder(target, heads),
                "lookup alone": dh.SpeculativeDecoder(target, dh.PromptLookupProposer())}
    prompts = _prompts(args, tokenizer)
    eos = tokenizer.eos_token_id
    rows: list[dict[str, Any]] = []
    totals = {m: {"tokens": 0, "seconds": 0.0, "steps": 0, "exact": 0} for m in MODES}
    for i, (category, ids) in enumerate(prompts):
        if i == 0:  # warm-up, untimed: allocator, threads
            target.generate(ids, max_new_tokens=4, do_sample=False)
            for d in decoders.values():
                d.generate(ids, max_new_tokens=4, temperature=0)
        order = MODES[i % 3:] + MODES[: i % 3]
        row: dict[str, Any] = {"category": category}
        reference = None
        outs = {}
        for mode in order:
            start = time.perf_counter()
            if mode == "plain":
                seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                                      do_sample=False, eos_token_id=eos, pad_token_id=eos)
                steps = int(seq.shape[1] - ids.shape[1])
                outs[mode] = (seq, steps, time.perf_counter() - start)
            else:
                out = decoders[mode].generate(ids, max_new_tokens=args.max_new_tokens, temperature=0, eos_token_id=eos)
                outs[mode] = (out.sequences, len(out.accept_lengths) or out.num_new_tokens, time.perf_counter() - start)
                row[f"{mode} ran"] = out.stats.get("mode")
        reference = outs["plain"][0]
        for mode in MODES:
            seq, steps, seconds = outs[mode]
            new = int(seq.shape[1] - ids.shape[1])
            exact = bool(torch.equal(seq, reference))
            row[mode] = {"tokens_per_second": new / seconds, "tokens_per_step": new / max(steps, 1), "exact": exact}
            t = totals[mode]
            t["tokens"] += new
            t["seconds"] += seconds
            t["steps"] += steps
            t["exact"] += exact
        rows.append(row)
    print(table(rows, totals))
    print(why(heads.plans, target.device.type, device_name(target.device)))
    return 0 if all(totals[m]["exact"] == len(rows) for m in MODES) else 1


def table(rows: list[dict[str, Any]], totals: dict[str, dict[str, Any]]) -> str:
    """The demo's table: per prompt and in all, tokens/s (x plain) and tokens per step per mode."""
    head = "| prompt | " + " | ".join(f"{m} tok/s | {m} tok/step" for m in MODES) + " | equal to generate |"
    lines = [head, "|" + "---|" * (2 + 2 * len(MODES))]
    for row in rows:
        plain = row["plain"]["tokens_per_second"]
        cells = []
        for m in MODES:
            speed = row[m]["tokens_per_second"]
            cells += [f"{speed:.1f}" + ("" if m == "plain" else f" ({speed / plain:.2f}x)"), f"{row[m]['tokens_per_step']:.2f}"]
        equal = "yes" if all(row[m]["exact"] for m in MODES) else "NO"
        lines.append(f"| {row['category']} | " + " | ".join(cells) + f" | {equal} |")
    plain_rate = totals["plain"]["tokens"] / max(totals["plain"]["seconds"], 1e-9)
    cells = []
    for m in MODES:
        t = totals[m]
        rate = t["tokens"] / max(t["seconds"], 1e-9)
        cells += [f"{rate:.1f}" + ("" if m == "plain" else f" ({rate / plain_rate:.2f}x)"),
                  f"{t['tokens'] / max(t['steps'], 1):.2f}"]
    exact = min(totals[m]["exact"] for m in MODES)
    lines.append("| **all** | " + " | ".join(cells) + f" | {exact}/{len(rows)} |")
    ratios = [row["plan"]["tokens_per_second"] / row["plain"]["tokens_per_second"] for row in rows]
    if ratios:
        lines.append(f"\nthe plan, per prompt: median {statistics.median(ratios):.2f}x plain ({min(ratios):.2f}-"
                     f"{max(ratios):.2f}); one run each, interleaved: a demonstration, not a benchmark")
    return "\n".join(lines)
