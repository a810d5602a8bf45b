"""What the demo target writes greedily after each bench prompt: the text every greedy acceptance
figure on the demo is measured on.

    python benchmarks/greedy_continuations.py [--target demo] [--new-tokens 128] [--out FILE]

Prompts: the 12 held-out prompts `draftheads bench` uses on the demo, and the mid-file set
(measurements/head-types-demo/midfile-prompts.jsonl). Per prompt: the continuation of
``target.generate(do_sample=False)``, and the share of its tokens inside a run where the same
token pair repeats back to back (``#\\n#\\n...``): a loop a drafter predicts or misses as a whole.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MIDFILE = ROOT / "benchmarks" / "measurements" / "head-types-demo" / "midfile-prompts.jsonl"


def two_token_loop_share(tokens: list[int]) -> float:
    """The share of tokens at positions where the pair before them repeats: tokens[i] == tokens[i - 2]
    and tokens[i - 1] == tokens[i - 3]."""
    looped = sum(1 for i in range(3, len(tokens)) if tokens[i] == tokens[i - 2] and tokens[i - 1] == tokens[i - 3])
    return looped / max(len(tokens), 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None, help="a JSON file for the continuations and shares")
    args = ap.parse_args()
    from draftheads.bench.questions import demo_questions
    from draftheads.target import load_target

    torch.set_num_threads(1)
    target, tokenizer = load_target(args.target)
    sets = {"bench": [q.turns[0] for q in demo_questions(tokenizer, 12)],
            "midfile": [json.loads(line)["turns"][0] for line in MIDFILE.read_text().splitlines() if line.strip()]}
    results = {}
    for name, texts in sets.items():
        rows = []
        for text in texts:
            ids = tokenizer(text, return_tensors="pt").input_ids
            out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.new_tokens)
            new = out[0, ids.shape[1]:].tolist()
            rows.append({"continuation": tokenizer.decode(new), "two_token_loop_share": round(two_token_loop_share(new), 3)})
            print(f"{name} {len(rows) - 1:2d} loop {rows[-1]['two_token_loop_share']:.2f} {rows[-1]['continuation'][:70]!r}")
        looping = sum(r["two_token_loop_share"] >= 0.5 for r in rows)
        print(f"{name}: {looping} of {len(rows)} continuations are half or more a two-token loop")
        results[name] = {"rows": rows, "half_or_more_looped": looping}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"new_tokens": args.new_tokens, **results}, indent=2))


if __name__ == "__main__":
    main()
