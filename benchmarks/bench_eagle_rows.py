"""Batched EAGLE drafting: one forked proposer per row vs `EagleRows` (one draft forward per depth
for all rows), and EagleRows' draft-cache compaction policies, side by side.

Every mode decodes the same left-padded batches (prompts of 64..128 tokens, so rows are padded
differently), interleaved round by round; the figure is each mode's tokens/s relative to
"forked" on the same batch, median and spread over batches and rounds. Outputs AND per-row
accept lengths are checked equal across modes (the same trees are drafted).

    python benchmarks/bench_eagle_rows.py --heads runs/demo-eagle/heads --batch-sizes 4,8
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import draftheads as dh
import draftheads.inference.batch as batch
from draftheads.inference.batch import left_pad
from draftheads.demo import corpus_texts, resolve_target
from draftheads.inference.proposers.eagle_rows import EagleRows
from draftheads.inference.proposers.rows import ForkedRows

MODES = {
    "forked": ForkedRows,
    "rows-never": lambda p: EagleRows(p, compaction="never"),
    "rows-auto": lambda p: EagleRows(p, compaction="auto"),
    "rows-always": lambda p: EagleRows(p, compaction="always"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="demo")
    ap.add_argument("--heads", required=True)
    ap.add_argument("--batch-sizes", default="4,8", help="batch 1 (no padding) takes the single-sequence path: same code in every mode")
    ap.add_argument("--batches", type=int, default=2, help="batches per size")
    ap.add_argument("--rounds", type=int, default=2, help="timed runs per batch and mode")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="folder for results.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_target(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    decoder = dh.SpeculativeDecoder(target, dh.load_heads(args.heads, target=target))
    texts = [t for t in corpus_texts("heldout") if len(t) > 2000]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    names = list(MODES)

    results = {}
    for size in [int(s) for s in args.batch_sizes.split(",")]:
        ratios = {m: [] for m in names}
        rates = {m: [] for m in names}
        for b in range(args.batches):
            prompts = [tokenizer(texts[(b * size + i) % len(texts)]).input_ids[: 64 + (37 * i) % 65] for i in range(size)]
            ids, mask = left_pad([torch.tensor(p) for p in prompts], pad)
            outputs = {}
            with torch.inference_mode():
                for r in range(args.rounds):
                    order = names[r % len(names):] + names[: r % len(names)]
                    seconds = {}
                    for mode in order:
                        batch.row_proposer = MODES[mode]
                        if r == 0:  # untimed warm-up at this shape
                            decoder.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])
                        t0 = time.perf_counter()
                        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, eos_token_id=[])
                        seconds[mode] = time.perf_counter() - t0
                        outputs[mode] = out
                    for mode in names:
                        rates[mode].append(outputs[mode].num_new_tokens / seconds[mode])
                        ratios[mode].append(seconds["forked"] / seconds[mode])
            first = outputs["forked"]
            for mode, out in outputs.items():
                assert torch.equal(out.sequences, first.sequences), f"{mode}: different tokens"
                assert out.stats["row_accept_lengths"] == first.stats["row_accept_lengths"], f"{mode}: different drafts"
        results[size] = {
            m: {
                "tokens_per_second_median": statistics.median(rates[m]),
                "vs_forked_median": statistics.median(ratios[m]),
                "vs_forked_min": min(ratios[m]),
                "vs_forked_max": max(ratios[m]),
            }
            for m in names
        }
        for m in names:
            r = results[size][m]
            print(f"batch {size} {m:>11}: {r['tokens_per_second_median']:.1f} tok/s, vs forked {r['vs_forked_median']:.2f}x "
                  f"[{r['vs_forked_min']:.2f}-{r['vs_forked_max']:.2f}]", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "results.json.tmp"
        tmp.write_text(json.dumps({"args": vars(args), "results": results, "exact": True}, indent=1) + "\n")
        tmp.replace(out / "results.json")


if __name__ == "__main__":
    main()
