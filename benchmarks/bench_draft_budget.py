"""The draft budget (online fallback) vs always-full drafts vs plain `generate`, interleaved; and
drawn drafts (the default when sampling) vs top-k trees.

    python benchmarks/bench_draft_budget.py --heads medusa=PATH --heads eagle=PATH \
        [--target demo] [--temperatures 0,0.7,1.0] [--seeds 2] [--num-prompts 12] \
        [--variants full,budget,topk,topk-full] [--no-plan] --out DIR

Variants per heads folder (``--variants``, default ``full,budget``): ``budget`` is the decoder as
users get it (online budget, drawn drafts when sampling), ``full`` the same with
``draft_budget=None``, ``topk`` with ``draw_drafts=False`` (the heads' top-k trees when sampling),
``topk-full`` both off. ``--no-plan`` passes ``batch_plan=None`` (always speculate, even where the
heads' tree.json says plain), to compare ways of drafting rather than the plan.

Per temperature, per held-out demo prompt (`bench.questions.demo_questions`: files neither the
target nor the heads trained on) and per seed, every variant runs once in a rotating order:
plain `target.generate` (top-k/top-p off, as in `draftheads bench`), and for each heads folder the
decoder with ``draft_budget=None`` ("<name>-full") and with the default online budget
("<name>-budget"). Decoders live for the whole run, so the online budget's cost table is the one
a long-running user has. Greedy outputs are checked against plain's. Writes DIR/results.json (every
sample) and DIR/summary.md (median per-sample speedup with min-max, accepted tokens per step,
fraction of plain steps).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import draftheads as dh
from draftheads.atomic import write_text_atomically
from draftheads.bench.questions import demo_questions
from draftheads.target import load_target


#: Decoder options per variant (the default decoder: draft_budget="auto", draw_drafts=True).
VARIANTS = {
    "budget": {},
    "full": {"draft_budget": None},
    "topk": {"draw_drafts": False},
    "topk-full": {"draft_budget": None, "draw_drafts": False},
}
PROMPT_LOOKUP = "prompt-lookup"


def variant_options(variant: str) -> dict:
    """Decoder options of ``variant``; ``budget:KEY=VALUE;...`` is the online budget with other
    settings (e.g. ``budget:decay=0.9``), one instance for the decoder's whole run (so run one
    temperature per process to keep what it learns at one from the other)."""
    name, _, settings = variant.partition(":")
    options = dict(VARIANTS[name])
    if settings:
        from draftheads.inference.draft_budget import OnlineDraftBudget

        kwargs = {k: float(v) if "." in v else int(v) for k, v in (kv.split("=") for kv in settings.split(";"))}
        options["draft_budget"] = OnlineDraftBudget(**kwargs)
    return options  # --heads NAME=prompt-lookup: the prompt lookup proposer (no heads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo")
    ap.add_argument("--heads", action="append", required=True,
                    help=f"NAME=PATH (repeatable); PATH {PROMPT_LOOKUP} for prompt lookup")
    ap.add_argument("--temperatures", default="0,0.7,1.0")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per prompt at T > 0 (greedy: one)")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", default="full,budget", help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--no-plan", action="store_true", help="batch_plan=None: speculate even where tree.json says plain")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    unknown = [v for v in args.variants.split(",") if v.split(":")[0] not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    target, tokenizer = load_target(args.target, device=torch.device("cpu"), dtype="auto")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prompts = [tokenizer(q.turns[0], return_tensors="pt").input_ids for q in demo_questions(tokenizer, args.num_prompts)]
    variants: dict[str, dh.SpeculativeDecoder] = {}
    for spec in args.heads:
        name, path = spec.split("=", 1)
        plan = {"batch_plan": None} if args.no_plan else {}
        for variant in args.variants.split(","):
            # A fresh proposer per variant: prompt lookup keeps per-generation state in it.
            drafter = dh.PromptLookupProposer() if path == PROMPT_LOOKUP else dh.load_heads(path, target=target)
            variants[f"{name}-{variant}"] = dh.SpeculativeDecoder(target, drafter, **variant_options(variant), **plan)

    def plain(ids, temperature, seed):
        sampling = {"do_sample": False} if temperature == 0 else {
            "do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        torch.manual_seed(seed)
        return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens,
                               pad_token_id=pad, eos_token_id=[], **sampling)

    def speculative(name, ids, temperature, seed):
        return variants[name].generate(ids, max_new_tokens=args.max_new_tokens, temperature=temperature, top_k=0,
                                       top_p=1.0, eos_token_id=[], seed=seed)

    samples, loads = [], []
    names = ["plain", *variants]
    with torch.inference_mode():
        for name in names:  # untimed warm-up of every variant (first calls pay lazy initialisation)
            if name == "plain":
                plain(prompts[0][:, :32], 0.7, 0)
            else:
                variants[name].generate(prompts[0][:, :32], max_new_tokens=16, temperature=0.7, top_k=0, eos_token_id=[])
        index = 0
        for temperature in [float(t) for t in args.temperatures.split(",")]:
            for p, ids in enumerate(prompts):
                for seed in range(1 if temperature == 0 else args.seeds):
                    order = names[index % len(names):] + names[: index % len(names)]
                    index += 1
                    results = {}
                    for name in order:
                        t0 = time.perf_counter()
                        result = plain(ids, temperature, seed) if name == "plain" else speculative(name, ids, temperature, seed)
                        results[name] = (result, time.perf_counter() - t0)
                    reference, plain_seconds = results["plain"]
                    for name in names:
                        result, seconds = results[name]
                        row = {"temperature": temperature, "prompt": p, "seed": seed, "variant": name, "seconds": seconds,
                               "plain_seconds": plain_seconds, "speedup": plain_seconds / seconds}
                        if name != "plain":
                            row["accept_lengths"] = result.accept_lengths
                            row["budget"] = result.stats.get("draft_budget")
                            if temperature == 0:
                                row["exact"] = bool(torch.equal(result.sequences, reference))
                        samples.append(row)
                    print(temperature, p, seed, " ".join(f"{n}={results['plain'][1] / results[n][1]:.2f}" for n in names[1:]),
                          flush=True)
                    loads.append(os.getloadavg()[0])
                    write(out_dir, args, samples, names, loads)  # after every sample: a killed run keeps what it did
    print(summary(samples, names[1:]))


def write(out_dir: Path, args, samples, names, loads) -> None:
    env = {"torch": torch.__version__, "machine": platform.processor() or platform.machine(), "threads": args.threads,
           "args": vars(args), "load_average_1min": {"min": min(loads), "median": statistics.median(loads), "max": max(loads)}}
    write_text_atomically(out_dir / "results.json", json.dumps({"environment": env, "samples": samples}, indent=1))
    write_text_atomically(out_dir / "summary.md", summary(samples, names[1:]))


def summary(samples, names) -> str:
    lines = ["| T | variant | speedup median (min-max) | accepted tokens/step | plain steps | capped steps | exact |",
             "|---|---|---|---|---|---|---|"]
    for temperature in sorted({s["temperature"] for s in samples}):
        for name in names:
            rows = [s for s in samples if s["temperature"] == temperature and s["variant"] == name]
            if not rows:
                continue
            speedups = [r["speedup"] for r in rows]
            lengths = [n for r in rows for n in r["accept_lengths"]]
            steps = {"full": 0, "capped": 0, "plain": 0}
            for r in rows:
                for mode, count in (r["budget"] or {}).get("steps", {}).items():
                    steps[mode] += count
            total = max(sum(steps.values()), 1)
            exact = [r["exact"] for r in rows if "exact" in r]
            lines.append(
                f"| {temperature:g} | {name} | {statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}) "
                f"| {sum(lengths) / max(len(lengths), 1):.2f} | {steps['plain'] / total:.0%} | {steps['capped'] / total:.0%} "
                f"| {('%d/%d' % (sum(exact), len(exact))) if exact else '-'} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
