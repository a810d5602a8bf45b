"""EAGLE trees ranked by joint draft probability (EAGLE-2) against the same trees ranked by the heads'
confidence table (`heads.confidence`), and against chains of equal verify tokens, on a real target.

The table is measured as ``draftheads calibrate`` measures it: on the target's greedy continuations of
the package's plan prompts (``--prompts``, default ``auto``: shaped like users' requests, never an
evaluation question). The trees are then decoded greedily on held-out questions (``--questions``,
default MT-Bench's first turns, through the chat template), every output checked equal to
``target.generate(do_sample=False)``; the report is tokens per step (hardware-independent), per
setting, with the per-question spread.

    python benchmarks/confidence_trees.py --target smollm2 --heads runs/smollm2/heads --out results/confidence-smollm2
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import draftheads as dh  # noqa: E402
from draftheads.bench.metrics import spread  # noqa: E402
from draftheads.data.plan_prompts import AUTO, default_set, encode_prompts, read_prompt_texts  # noqa: E402
from draftheads.tune.calibrate import calibrate_confidence  # noqa: E402
from report_files import write_report  # noqa: E402
from tree_runs import add_arguments, chosen_settings, header, load  # noqa: E402

#: Chains and trees of equal verify tokens: EAGLE-2 trees as deep as the chain (top 2), top-3 trees five
#: deep (the CPU grid's), and the device defaults (CPU: 12 tokens, depth 5, top 4; CUDA: 60 / 6 / 10).
SETTINGS = {
    **{f"chain-{n}": {"total_tokens": n, "depth": n - 1, "top_k": 1} for n in (4, 8)},
    **{f"tree-{n}": {"total_tokens": n, "depth": n - 1, "top_k": 2} for n in (4, 8)},
    "top3-8": {"total_tokens": 8, "depth": 5, "top_k": 3},
    "cpu-default-12": {"total_tokens": 12, "depth": 5, "top_k": 4},
    "gpu-default-60": {"total_tokens": 60, "depth": 6, "top_k": 10},
}


@torch.no_grad()
def tokens_per_step(target, heads, prompts: list[torch.Tensor], want: list[torch.Tensor], tree: dict,
                    new: int) -> dict:
    """Greedy decodes of every prompt with ``tree`` (each checked against ``want``): tokens per step
    over all of them and per prompt."""
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draft_budget=None, batch_plan=None, prompt_lookup=False)
    per_prompt, tokens, steps = [], 0, 0
    for i, (p, w) in enumerate(zip(prompts, want)):
        out = decoder.generate(p, max_new_tokens=new, eos_token_id=[])
        if out.sequences[0].tolist() != w.tolist():
            raise AssertionError(f"{tree}: prompt {i} differs from generate")
        per_prompt.append(sum(out.accept_lengths) / len(out.accept_lengths))
        tokens += sum(out.accept_lengths)
        steps += len(out.accept_lengths)
    return {"tokens_per_step": tokens / steps, "per_prompt": spread(per_prompt)}


def markdown(report: dict) -> str:
    conf = report["confidence"]["measured_on"]
    lines = [f"Target `{report['target']}`, heads `{report['heads']}` ({report['head_type']}); {report['machine']}, "
             f"{report['threads']} threads; {report['date']}. Confidence table from {conf['roots']} roots of the target's "
             f"greedy continuations of {conf['sequences']} plan prompts ({report['confidence']['seconds']:.0f} s). "
             f"Held out: {report['questions']} questions of {report['question_set']}, {report['new_tokens']} new tokens "
             "each, greedy, every output equal to `generate`.", "",
             "| setting (total tokens, depth, top-k) | by draft probability | by the confidence table | "
             "per question (table): median (min-max) |", "|---|---|---|---|"]
    for name, tree in SETTINGS.items():
        if name not in report["raw"]:
            continue
        raw, ranked = report["raw"][name], report["ranked"].get(name)
        s = (ranked or raw)["per_prompt"]
        lines.append(f"| {name} ({tree['total_tokens']}, {tree['depth']}, {tree['top_k']}) | {raw['tokens_per_step']:.2f} | "
                     + (f"{ranked['tokens_per_step']:.2f}" if ranked else "(a chain: the same)")
                     + f" | {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}) |")
    lines += ["", "The table (chance of acceptance by rank among siblings, per draft-probability bin):", "", "```",
              *report["confidence_summary"], "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=AUTO, help="what the confidence table is measured on (calibrate's --prompts)")
    ap.add_argument("--num-prompts", type=int, default=12)
    add_arguments(ap, SETTINGS, num_questions=16)
    args = ap.parse_args()
    settings = chosen_settings(ap, args, SETTINGS)
    target, tokenizer, heads, chat, questions, prompts = load(args)
    names = default_set(chat) if args.prompts == AUTO else args.prompts
    plan_prompts = encode_prompts(tokenizer, read_prompt_texts(names)[: args.num_prompts], chat, 256)
    t0 = time.perf_counter()
    table = calibrate_confidence(target, heads, plan_prompts, new_tokens=args.new_tokens)
    seconds = time.perf_counter() - t0
    with torch.no_grad():
        want = [target.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=args.new_tokens,
                                min_new_tokens=args.new_tokens, pad_token_id=0)[0] for p in prompts]
    report = {**header(args, heads, questions),
              "confidence": {**table.to_json(), "seconds": seconds}, "confidence_summary": table.summary(),
              "raw": {}, "ranked": {}}
    for name, tree in settings.items():
        heads.confidence = None
        report["raw"][name] = tokens_per_step(target, heads, prompts, want, tree, args.new_tokens)
        if tree["top_k"] > 1:
            heads.confidence = table
            report["ranked"][name] = tokens_per_step(target, heads, prompts, want, tree, args.new_tokens)
        print(name, json.dumps({k: round(v[name]["tokens_per_step"], 3) for k, v in
                                (("raw", report["raw"]), ("ranked", report["ranked"])) if name in v}), flush=True)
    write_report(Path(args.out), args, report, markdown(report))


if __name__ == "__main__":
    main()
