"""The batched A/B runner of bench_batch_compaction.py: variants
of one decoder run on the same left-padded batches, interleaved round by round, outputs checked equal.

A variant is a name and a function that switches the decoder to it. Batches are the demo's held-out
code files, prompts of 64..128 tokens so rows are padded differently. The figure is each variant's
tokens/s relative to the baseline variant on the same batch: median and spread over batches and rounds.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import draftheads as dh
from draftheads.atomic import write_json_atomically
from draftheads.demo import corpus_texts, resolve_target
from draftheads.inference.inputs import left_pad


def add_arguments(ap: argparse.ArgumentParser, batches: int) -> None:
    ap.add_argument("--target", default="demo")
    ap.add_argument("--heads", required=True)
    ap.add_argument("--batch-sizes", default="4,8",
                    help="batch 1 (no padding) takes the single-sequence path: the same code for every variant")
    ap.add_argument("--batches", type=int, default=batches, help="batches per size")
    ap.add_argument("--rounds", type=int, default=2, help="timed runs per batch and variant")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="folder for results.json")


def compare(args: argparse.Namespace, variants: dict[str, Callable[[dh.SpeculativeDecoder], None]], baseline: str,
            same_drafts: bool = False) -> dict:
    """Run every variant on every batch; ``same_drafts`` also asserts equal per-row accept lengths
    (variants that must draft the same trees). Prints one line per size and variant and writes
    ``args.out``/results.json."""
    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_target(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    decoder = dh.SpeculativeDecoder(target, dh.load_heads(args.heads, target=target))
    texts = [t for t in corpus_texts("heldout") if len(t) > 2000]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    names = list(variants)

    results = {}
    for size in [int(s) for s in args.batch_sizes.split(",")]:
        ratios = {v: [] for v in names}
        rates = {v: [] for v in names}
        for b in range(args.batches):
            prompts = [tokenizer(texts[(b * size + i) % len(texts)]).input_ids[: 64 + (37 * i) % 65] for i in range(size)]
            ids, mask = left_pad([torch.tensor(p) for p in prompts], pad)
            outputs = {}
            with torch.inference_mode():
                for r in range(args.rounds):
                    seconds = {}
                    for name in names[r % len(names):] + names[: r % len(names)]:
                        variants[name](decoder)
                        if r == 0:  # untimed warm-up at this shape
                            decoder.generate(ids, attention_mask=mask, max_new_tokens=8, eos_token_id=[])
                        t0 = time.perf_counter()
                        outputs[name] = decoder.generate(ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                                         eos_token_id=[])
                        seconds[name] = time.perf_counter() - t0
                    for name in names:
                        rates[name].append(outputs[name].num_new_tokens / seconds[name])
                        ratios[name].append(seconds[baseline] / seconds[name])
            first = outputs[baseline]
            for name, out in outputs.items():
                assert torch.equal(out.sequences, first.sequences), f"{name}: different tokens"
                if same_drafts:
                    assert out.stats["row_accept_lengths"] == first.stats["row_accept_lengths"], f"{name}: different drafts"
        results[size] = {
            name: {
                "tokens_per_second_median": statistics.median(rates[name]),
                f"vs_{baseline}_median": statistics.median(ratios[name]),
                f"vs_{baseline}_min": min(ratios[name]),
                f"vs_{baseline}_max": max(ratios[name]),
            }
            for name in names
        }
        width = max(len(n) for n in names)
        for name in names:
            r = results[size][name]
            print(f"batch {size} {name:>{width}}: {r['tokens_per_second_median']:.1f} tok/s, vs {baseline} "
                  f"{r[f'vs_{baseline}_median']:.2f}x [{r[f'vs_{baseline}_min']:.2f}-{r[f'vs_{baseline}_max']:.2f}]",
                  flush=True)
    if args.out:
        write_json_atomically(Path(args.out) / "results.json", {"args": vars(args), "results": results, "exact": True})
    return results
