"""The heads' plan behind prompt lookup under each draft budget it can have: lookup's copies
budgeted and the heads drafting as the plan chose (the default), a budget for each of the two,
one budget for both (the default before 2026-12-05), and none (always the full draft); beside
prompt lookup alone and plain ``generate``, through `draftheads bench`'s own runner (greedy outputs
checked equal to plain's).

    python benchmarks/hybrid_budget.py --heads runs/smollm2/heads [--questions mt-bench] [--max-questions 16]
        [--temperature 0.7] [--decoders lookup-only,per-source,shared,none,lookup] [--out DIR]

Why: behind prompt lookup (`proposers.hybrid.LookupThenHeads`) one budget judged both drafters.
Where the heads' drafts did not pay it went plain, and then lookup's copies were not drafted
either until a probe happened to land on one (MT-Bench writing on SmolLM2). ``draftheads bench``
has no switch for the budget, so this measures what each costs. Each decoder keeps its budget
across the questions, as bench's do; the budget follows measured seconds, so a run's path can
differ from the next one's: repeat it.

Prints, and writes into DIR/results.md (every sample into DIR/results.json): per decoder the
speedup as bench computes it, the median (min-max) over samples, the decode-only speedup (the
first token and the prefill left out, `bench.metrics`), accepted tokens per step, the
share of steps the budget took plain, and the speedup per category.
"""
from __future__ import annotations

import argparse

import torch
from runner_report import require_exact, speedup_cells, write_report


def source_plain_share(samples, source: str) -> float:
    """The share of ``source``'s steps its own budget took plain, over ``samples``."""
    counts = [sum(s.stats.get(f"budget_{source}_{mode}", 0) for s in samples) for mode in ("full", "capped", "plain")]
    return counts[2] / max(sum(counts), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--heads", required=True, help="a heads folder whose plan puts prompt lookup in front")
    ap.add_argument("--questions", default="mt-bench")
    ap.add_argument("--categories", default=None, help="comma-separated (default: every category)")
    ap.add_argument("--max-questions", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--decoders", default="lookup-only,per-source,shared,none,lookup",
                    help="which to run, comma-separated: lookup-only (the default budget), per-source, shared, none, "
                         "lookup (prompt lookup alone)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.bench.methods import Method
    from draftheads.bench.metrics import OVERALL, summarize
    from draftheads.bench.questions import categories, load_questions, select
    from draftheads.bench.runner import Runner, Settings
    from draftheads.inference.draft_budget import OnlineDraftBudget, PerSourceBudget
    from draftheads.target import load_target

    target, tokenizer = load_target(args.target)
    heads = dh.load_heads(args.heads, target=target)
    questions = select(load_questions(args.questions), args.categories.split(",") if args.categories else None,
                       args.max_questions)
    budgets = {
        "lookup-only": ("plan, lookup's copies budgeted, heads always drafting (default)", "auto"),
        "per-source": ("plan, a budget per source (lookup and heads)",
                       lambda: PerSourceBudget({"lookup": OnlineDraftBudget(), "heads": OnlineDraftBudget()})),
        "shared": ("plan, one budget for both", OnlineDraftBudget),
        "none": ("plan, no budget", None),
    }
    methods = []
    for key in args.decoders.split(","):
        if key == "lookup":
            methods.append(Method("prompt lookup alone", dh.SpeculativeDecoder(target, dh.PromptLookupProposer())))
        elif key in budgets:
            name, budget = budgets[key]
            methods.append(Method(name, dh.SpeculativeDecoder(target, heads, draft_budget=budget() if callable(budget)
                                                             else budget)))
        else:
            ap.error(f"--decoders: unknown {key!r} (known: {', '.join([*budgets, 'lookup'])})")
    settings = Settings(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed)
    samples = Runner(target, tokenizer, methods, settings).run(questions)
    require_exact(samples)
    cats = categories(questions)
    results = summarize(samples, [m.name for m in methods], cats)

    lines = [f"| decoder | speedup | per sample: median (min-max) | decode-only speedup | accepted per step | plain steps (of each source's) | {' | '.join(cats)} |",
             "|---|---|---|---|---|---|" + "---|" * len(cats)]  # fmt: skip
    for m in methods:
        groups = results[m.name]["by_category"]
        overall = groups[OVERALL]
        mine = [s for s in samples if s.method == m.name]
        plain_steps = sum(s.stats.get("budget_plain", 0) for s in mine) / max(sum(len(s.accept_lengths) for s in mine), 1)
        plain_cell = f"{plain_steps:.0%}"
        if any("budget_lookup_plain" in s.stats for s in mine):  # a budget per source: each one's plain share
            plain_cell += " (" + ", ".join(f"{source} {source_plain_share(mine, source):.0%}"
                                           for source in ("lookup", "heads")) + ")"
        per_cat = " | ".join(f"{groups[c]['speedup']:.2f}x" for c in cats)
        decode = overall["decode_speedup"]
        lines.append(f"| {m.name} | {speedup_cells(overall)} | {'-' if decode is None else f'{decode:.2f}x'} "
                     f"| {overall['mean_accepted_tokens']:.2f} "
                     f"| {plain_cell} | {per_cat} |")
    table = "\n".join(lines) + "\n"
    print(table)
    write_report(args.out, args, [s.to_dict() for s in samples], table=table,
                 header=f"{len(questions)} questions (every turn) from {args.questions}, up to {args.max_new_tokens} "
                        f"new tokens, {'greedy' if args.temperature == 0 else f'T = {args.temperature}'}, one round; "
                        f"heads {args.heads}.")


if __name__ == "__main__":
    main()
