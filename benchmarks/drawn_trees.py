"""EAGLE trees DRAWN at a sampling temperature (siblings without replacement, in the shape fitted to
their measured acceptance: `inference.proposers.drawn_trees`) against drawn chains of the same
verify tokens and against the same trees' top-k candidates, on a real target.

Held-out questions (``--questions``, default MT-Bench's first turns, through the chat template),
each decoded once per seed and setting (the sibling counts start from their prior at every
generation, so that a seed alone fixes the draws). The
report is tokens per step (hardware-independent) per setting: over all seeds, per seed, and the
per-question spread. Nothing here is compared with `generate` (a sample has no one answer to
equal); the law of drawn trees is tested by chi-square (tests/test_drawn_trees.py,
tests/test_drawn_drafts.py, tests/test_hybrid_targets.py).

    python benchmarks/drawn_trees.py --target smollm2 --heads runs/smollm2/heads --out results/drawn-trees-smollm2
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import draftheads as dh  # noqa: E402
from draftheads.bench.metrics import spread  # noqa: E402
from draftheads.inference.proposers.drawn_trees import drawn_tree_tokens  # noqa: E402
from report_files import write_report  # noqa: E402
from tree_runs import add_arguments, chosen_settings, header, load  # noqa: E402

#: Chains and trees of equal verify tokens (a drawn tree verifies depth + 1 tokens at most, as a drawn
#: chain as deep): trees as deep as the chain with up to 2 or 3 siblings, and the CPU default (12 tokens,
#: depth 5, top 4), which draws 6.
SETTINGS = {
    **{f"chain-{n}": {"total_tokens": n, "depth": n - 1, "top_k": 1} for n in (4, 8)},
    **{f"tree-{n}": {"total_tokens": n, "depth": n - 1, "top_k": 2} for n in (4, 8)},
    "top3-8": {"total_tokens": 8, "depth": 7, "top_k": 3},
    "cpu-default-12": {"total_tokens": 12, "depth": 5, "top_k": 4},
}


@torch.no_grad()
def tokens_per_step(target, heads, prompts: list[torch.Tensor], tree: dict, drawn: bool, args, seed: int) -> dict:
    """Every prompt sampled once with ``tree`` (drawn drafts or top-k candidates) by one fresh decoder."""
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draft_budget=None, batch_plan=None,
                                    prompt_lookup=False, draw_drafts=drawn)
    per_prompt, tokens, steps, stats = [], 0, 0, {}
    for i, p in enumerate(prompts):
        out = decoder.generate(p, max_new_tokens=args.new_tokens, eos_token_id=[], temperature=args.temperature,
                               top_k=args.top_k, seed=seed * 1000 + i)
        per_prompt.append(sum(out.accept_lengths) / len(out.accept_lengths))
        tokens += sum(out.accept_lengths)
        steps += len(out.accept_lengths)
        stats = out.stats.get("drawn_sibling_acceptance", stats)
    return {"tokens_per_step": tokens / steps, "steps": steps, "per_prompt": per_prompt,
            **({"sibling_acceptance": stats} if stats else {})}


def markdown(report: dict) -> str:
    seeds = report["seeds"]
    lines = [f"Target `{report['target']}`, heads `{report['heads']}` ({report['head_type']}); {report['machine']}, "
             f"{report['threads']} threads; {report['date']}. Sampled at T = {report['temperature']:g}, top-k "
             f"{report['top_k']}: {report['questions']} questions of {report['question_set']}, {report['new_tokens']} "
             f"new tokens each, {len(seeds)} seed(s) per question.", "",
             "| setting (total tokens, depth, top-k) | drawn: verify tokens | drawn: tokens per step (per seed) | "
             "per question: median (min-max) | top-k candidates (point masses, total tokens) |", "|---|---|---|---|---|"]
    for name, tree in SETTINGS.items():
        runs = report["drawn"].get(name)
        if runs is None:
            continue
        total = sum(r["tokens_per_step"] * r["steps"] for r in runs) / sum(r["steps"] for r in runs)
        s = spread([x for r in runs for x in r["per_prompt"]])
        top = report["top_k_trees"].get(name)
        top_cell = "-" if top is None else (
            f"{sum(r['tokens_per_step'] * r['steps'] for r in top) / sum(r['steps'] for r in top):.2f}")
        lines.append(f"| {name} ({tree['total_tokens']}, {tree['depth']}, {tree['top_k']}) | "
                     f"{drawn_tree_tokens(tree['total_tokens'], tree['depth'])} | {total:.2f} ("
                     + ", ".join(f"{r['tokens_per_step']:.2f}" for r in runs) + f") | {s['median']:.2f} "
                     f"({s['min']:.2f}-{s['max']:.2f}) | {top_cell} |")
    rates = {name: runs[-1]["sibling_acceptance"] for name, runs in report["drawn"].items()
             if runs and "sibling_acceptance" in runs[-1]}
    if rates:
        lines += ["", "Each drawn tree's sibling acceptance by rank in its last generation (the chance the verifier "
                  "accepted the j-th drawn sibling when it tried it; prior 0.5, two tries):", ""]
        lines += [f"- {name}: {', '.join(f'{c:.2f}' for c in r)}" for name, r in rates.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=50, help="the target's top-k while sampling (transformers' default)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--top-k-trees", action=argparse.BooleanOptionalAction, default=True,
                    help="also decode each setting's top-k candidates (point masses; a chain: each depth's best)")
    add_arguments(ap, SETTINGS, num_questions=8)
    args = ap.parse_args()
    settings = chosen_settings(ap, args, SETTINGS)
    if args.temperature <= 0:
        ap.error("--temperature must be above 0: greedy trees draw nothing (benchmarks/confidence_trees.py)")
    target, _, heads, _, questions, prompts = load(args)
    report = {**header(args, heads, questions),
              "temperature": args.temperature, "top_k": args.top_k, "seeds": list(range(args.seeds)),
              "drawn": {}, "top_k_trees": {}}
    for name, tree in settings.items():
        report["drawn"][name] = [tokens_per_step(target, heads, prompts, tree, True, args, s) for s in range(args.seeds)]
        if args.top_k_trees:
            report["top_k_trees"][name] = [tokens_per_step(target, heads, prompts, tree, False, args, s)
                                           for s in range(args.seeds)]
        print(name, [round(r["tokens_per_step"], 3) for r in report["drawn"][name]],
              [round(r["tokens_per_step"], 3) for r in report["top_k_trees"].get(name, [])], flush=True)
    write_report(Path(args.out), args, report, markdown(report))


if __name__ == "__main__":
    main()
