"""Prompt lookup alone with two ``min_ngram`` settings, side by side with plain ``generate``,
through `draftheads bench`'s own runner: per question and turn (second turns continue with plain's
answer), plain and both settings back to back in a rotating order, greedy, every output checked
equal to plain's. Each setting keeps one decoder (and so one draft budget) across the questions,
as ``draftheads bench`` does; its ``prompt-lookup`` method has no ``min_ngram`` to vary.

    python benchmarks/lookup_min_ngram.py [--questions mt-bench] [--max-questions 16] [--min-ngram 1,2] [--out DIR]

Prints, and writes into DIR/results.md (every sample into DIR/results.json), per setting: the
speedup over all samples as bench computes it, the median (min-max) over samples, how many samples
ran below 0.95x, and the mean accepted tokens per step.
"""
from __future__ import annotations

import argparse

import torch
from runner_report import require_exact, speedup_cells, write_report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--questions", default="mt-bench")
    ap.add_argument("--max-questions", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-ngram", default="1,2", help="two settings, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    settings = [int(n) for n in args.min_ngram.split(",")]
    if len(settings) != 2:
        raise SystemExit(f"--min-ngram: give two settings, got {args.min_ngram!r}")
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.bench.methods import Method
    from draftheads.bench.metrics import OVERALL, summarize
    from draftheads.bench.questions import categories, load_questions, select
    from draftheads.bench.runner import Runner, Settings
    from draftheads.target import load_target

    target, tokenizer = load_target(args.target)
    questions = select(load_questions(args.questions), None, args.max_questions)
    methods = [Method(f"min_ngram={n}", dh.SpeculativeDecoder(target, dh.PromptLookupProposer(min_ngram=n)))
               for n in settings]  # fmt: skip
    samples = Runner(target, tokenizer, methods, Settings(max_new_tokens=args.max_new_tokens)).run(questions)
    require_exact(samples)
    results = summarize(samples, [m.name for m in methods], categories(questions))

    lines = ["| prompt lookup | speedup | per sample: median (min-max) | samples below 0.95x | accepted per step |",
             "|---|---|---|---|---|"]  # fmt: skip
    for m in methods:
        overall, per_sample = results[m.name]["by_category"][OVERALL], results[m.name]["per_question"]
        below = sum(q["speedup"] is not None and q["speedup"] < 0.95 for q in per_sample)
        lines.append(f"| {m.name} | {speedup_cells(overall)} | {below} of {len(per_sample)} "
                     f"| {overall['mean_accepted_tokens']:.2f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    write_report(args.out, args, [s.to_dict() for s in samples], table=table,
                 header=f"{overall['samples']} samples ({len(questions)} questions, every turn) from {args.questions}, "
                        f"up to {args.max_new_tokens} new tokens, greedy, one round.")


if __name__ == "__main__":
    main()
