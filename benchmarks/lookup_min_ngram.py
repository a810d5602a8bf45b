"""Prompt lookup alone with two ``min_ngram`` settings, side by side with plain ``generate``: per
question and turn (MT-Bench's second turns see the target's own first answer), plain, then both
settings in alternating order, greedy, every output checked equal to plain. Each setting keeps one
decoder (and so one draft budget) across the questions, as ``draftheads bench`` does.

    python benchmarks/lookup_min_ngram.py [--questions mt-bench] [--max-questions 16] [--min-ngram 1,2] [--out DIR]

Prints one JSON line per sample; then, per setting, the overall speedup (plain's seconds over the
setting's, all samples) and the median / min / max over samples, into DIR/results.md (and every
sample into DIR/results.json) when ``--out`` is given.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch


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
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.bench.questions import load_questions, select
    from draftheads.bench.runner import encode_turn
    from draftheads.target import load_target

    settings = [int(n) for n in args.min_ngram.split(",")]
    if len(settings) != 2:
        raise SystemExit(f"--min-ngram: give two settings, got {args.min_ngram!r}")
    target, tokenizer = load_target(args.target)
    questions = select(load_questions(args.questions), None, args.max_questions)
    decoders = {n: dh.SpeculativeDecoder(target, dh.PromptLookupProposer(min_ngram=n)) for n in settings}

    def plain(ids):
        start = time.perf_counter()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens)
        return out, time.perf_counter() - start

    warm = encode_turn(tokenizer, questions[0], 0, [], True)
    plain(warm)
    for decoder in decoders.values():
        decoder.generate(warm, max_new_tokens=16)
    rows = []
    for i, question in enumerate(questions):
        answers: list[str] = []
        for turn in range(len(question.turns)):
            ids = encode_turn(tokenizer, question, turn, answers, True)
            reference, plain_seconds = plain(ids)
            row = {"question": question.question_id, "category": question.category, "turn": turn,
                   "tokens": reference.shape[1] - ids.shape[1], "plain_seconds": plain_seconds}  # fmt: skip
            for n in settings if (i + turn) % 2 == 0 else settings[::-1]:
                start = time.perf_counter()
                out = decoders[n].generate(ids, max_new_tokens=args.max_new_tokens)
                seconds = time.perf_counter() - start
                if not torch.equal(out.sequences, reference):
                    raise AssertionError(f"min_ngram={n}: question {question.question_id} turn {turn} differs from generate")
                steps = out.accept_lengths
                row[f"min_ngram={n}"] = {"speedup": plain_seconds / seconds, "seconds": seconds,
                                         "accepted_per_step": sum(steps) / len(steps)}  # fmt: skip
            answers.append(tokenizer.decode(reference[0, ids.shape[1] :], skip_special_tokens=True))
            rows.append(row)
            print(json.dumps(row), flush=True)
    lines = ["| prompt lookup | overall speedup | per sample: median (min-max) | samples below 0.95x | accepted per step |",
             "|---|---|---|---|---|"]  # fmt: skip
    for n in settings:
        key = f"min_ngram={n}"
        speedups = [r[key]["speedup"] for r in rows]
        overall = sum(r["plain_seconds"] for r in rows) / sum(r[key]["seconds"] for r in rows)
        accepted = statistics.mean(r[key]["accepted_per_step"] for r in rows)
        lines.append(f"| {key} | {overall:.2f}x | {statistics.median(speedups):.2f}x ({min(speedups):.2f}-{max(speedups):.2f}) "
                     f"| {sum(s < 0.95 for s in speedups)} of {len(rows)} | {accepted:.2f} |")  # fmt: skip
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"args": vars(args), "samples": rows}, indent=2))
        (out / "results.md").write_text(f"{len(rows)} samples ({len(questions)} questions, every turn) from {args.questions}, "
                                        f"up to {args.max_new_tokens} new tokens, greedy, one round.\n\n" + table)  # fmt: skip


if __name__ == "__main__":
    main()
