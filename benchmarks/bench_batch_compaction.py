"""Batched speculative decoding: cache holes kept masked vs compacted, side by side.

The batched loop (draftheads/inference/batch.py) shares one KV cache between rows that accept
different numbers of tokens. "never" keeps the holes and masks them (attention runs over them),
"always" gathers the whole cache after every step (no holes, one full-cache copy per step),
"auto" compacts only when a finished row is dropped (a copy made anyway) or holes exceed a
quarter of the cache. Every policy decodes the same left-padded batches (prompts of different
lengths), interleaved round by round; the figure is each policy's tokens/s relative to "never"
on the same batch, median and spread over batches and rounds. Outputs are checked equal.

    python benchmarks/bench_batch_compaction.py --heads runs/demo/heads --batch-sizes 4,8
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
from draftheads.inference.batch import left_pad
from draftheads.demo import corpus_texts, resolve_target

POLICIES = ("never", "auto", "always")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="demo")
    ap.add_argument("--heads", required=True)
    ap.add_argument("--batch-sizes", default="4,8")
    ap.add_argument("--batches", type=int, default=3, help="batches per size")
    ap.add_argument("--rounds", type=int, default=2, help="timed runs per batch and policy")
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

    results = {}
    for size in [int(s) for s in args.batch_sizes.split(",")]:
        ratios = {p: [] for p in POLICIES}
        rates = {p: [] for p in POLICIES}
        for b in range(args.batches):
            # Prompt lengths 64..128 tokens so rows are padded differently.
            prompts = [tokenizer(texts[(b * size + i) % len(texts)]).input_ids[: 64 + (37 * i) % 65] for i in range(size)]
            ids, mask = left_pad([torch.tensor(p) for p in prompts], pad)
            outputs = {}
            with torch.inference_mode():
                decoder.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])  # warm-up
                for r in range(args.rounds):
                    order = POLICIES[r % 3:] + POLICIES[: r % 3]
                    seconds = {}
                    for policy in order:
                        decoder.batch_compaction = policy
                        t0 = time.perf_counter()
                        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=args.max_new_tokens, eos_token_id=[])
                        seconds[policy] = time.perf_counter() - t0
                        outputs[policy] = out
                    for policy in POLICIES:
                        rates[policy].append(outputs[policy].num_new_tokens / seconds[policy])
                        ratios[policy].append(seconds["never"] / seconds[policy])
            first = outputs[POLICIES[0]].sequences
            assert all(torch.equal(o.sequences, first) for o in outputs.values()), "policies disagree"
        results[size] = {
            p: {
                "tokens_per_second_median": statistics.median(rates[p]),
                "vs_never_median": statistics.median(ratios[p]),
                "vs_never_min": min(ratios[p]),
                "vs_never_max": max(ratios[p]),
            }
            for p in POLICIES
        }
        for p in POLICIES:
            r = results[size][p]
            print(f"batch {size} {p:>6}: {r['tokens_per_second_median']:.1f} tok/s, vs never {r['vs_never_median']:.2f}x "
                  f"[{r['vs_never_min']:.2f}-{r['vs_never_max']:.2f}]", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
