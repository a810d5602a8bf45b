"""Block verification against token-by-token verification, the same heads drafting the same chains,
side by side with plain ``generate``, through `draftheads bench`'s own runner.

    python benchmarks/block_verification.py --heads runs/smollm2/heads [--chains 2,3] \
        [--temperatures 0.7,1.0] [--questions mt-bench] [--max-questions 8] [--out DIR]

Block verification (``generate(..., acceptance="block")``) only changes anything for a chain of
two or more drafts SAMPLED from the heads (`inference.accept_block`): for one draft, or for point
masses such as prompt lookup's, it accepts what the token rule accepts. The main job's plan drafts
a chain of one token, where the two rules are the same by construction, so each chain depth here is
forced (``tree``: a chain of g drafts, heads alone, no draft budget: every step drafts all g) and
decoded twice per prompt, once per rule, in the runner's rotating order with plain ``generate``.
``draftheads bench`` runs the same comparison for any method as NAME and NAME@block, under the plan.

Prints, and writes into DIR/results.md (every sample into DIR/results.json), per temperature and
chain: accepted tokens per step for each rule, acceptance by depth, and the speedup over plain.
"""
from __future__ import annotations

import argparse

import torch
from runner_report import speedup_cells, write_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--heads", required=True, help="a heads folder")
    ap.add_argument("--chains", default="2,3", help="chain depths to force, comma-separated")
    ap.add_argument("--temperatures", default="0.7,1.0", help="comma-separated, each > 0 (greedy: both rules are argmax)")
    ap.add_argument("--questions", default="mt-bench")
    ap.add_argument("--max-questions", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--no-chat-template", action="store_true", help="feed the questions as raw text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    chains = [int(g) for g in args.chains.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    if min(chains) < 1 or min(temperatures) <= 0:
        raise SystemExit("--chains: depths >= 1; --temperatures: each > 0")
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.bench.methods import Method
    from draftheads.bench.metrics import OVERALL, summarize
    from draftheads.bench.questions import categories, load_questions, select
    from draftheads.bench.runner import Runner, Settings
    from draftheads.target import load_target

    target, tokenizer = load_target(args.target)
    heads = dh.load_heads(args.heads, target=target)
    questions = select(load_questions(args.questions), None, args.max_questions)
    methods = []
    for g in chains:
        chain = {"total_tokens": g + 1, "depth": g, "top_k": 1}
        for rule in ("exact", "block"):
            decoder = dh.SpeculativeDecoder(target, heads, tree=chain, prompt_lookup=False, draft_budget=None)
            methods.append(Method(f"chain of {g}" + ("@block" if rule == "block" else ""), decoder, acceptance=rule))

    lines = ["| T | chain | rule | accepted per step | acceptance at depth 1/2/3 | speedup | per sample: median (min-max) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    every = []
    for temperature in temperatures:
        settings = Settings(max_new_tokens=args.max_new_tokens, temperature=temperature,
                            use_chat_template=not args.no_chat_template)
        samples = Runner(target, tokenizer, methods, settings).run(questions)
        every += [{"temperature": temperature, **s.to_dict()} for s in samples]
        results = summarize(samples, [m.name for m in methods], categories(questions))
        for m in methods:
            overall = results[m.name]["by_category"][OVERALL]
            by_depth = results[m.name]["acceptance_by_depth"]
            depths = "/".join(f"{by_depth[str(d)]:.2f}" if str(d) in by_depth else "-" for d in (1, 2, 3))
            name, _, rule = m.name.partition("@")
            lines.append(f"| {temperature:g} | {name.removeprefix('chain of ')} | {rule or 'token'} "
                         f"| {overall['mean_accepted_tokens']:.3f} | {depths} | {speedup_cells(overall)} |")
    table = "\n".join(lines) + "\n"
    print(table)
    write_report(args.out, args, every, table=table,
                 header=f"{len(questions)} questions (every turn) from {args.questions}, up to {args.max_new_tokens} "
                        f"new tokens, one round; heads {args.heads}, each chain forced (no draft budget, no prompt lookup).")


if __name__ == "__main__":
    main()
