"""Medusa heads vs plain `generate` on the demo target: one run, interleaved, same prompts.

    python benchmarks/bench_medusa.py --heads runs/demo/heads [--target demo] [--num-prompts 12]
        [--max-new-tokens 128] [--prompt-tokens 128] [--threads 2] [--out results/bench_medusa]

Prompts are code-completion prompts: the first --prompt-tokens tokens of each of the demo
corpus' held-out files (never trained on, neither by the target nor the heads). For each prompt,
plain greedy `target.generate` and `SpeculativeDecoder.generate` run back to back, --rounds
times in alternating order (after a warm-up of both; per-prompt medians), and the outputs must
be identical. Reported: tokens/s of each, speedup
(median and spread over prompts), mean accepted tokens per target forward, time per step spent
outside the target forward, and the "ideal" speedup = mean accepted length x one-token forward
time / tree forward time (what a zero-overhead loop would reach with these acceptances).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

import draftheads as dh
from draftheads.demo import corpus_texts, resolve_target
from draftheads.tune.calibrate import measure_verify_times


def quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="demo")
    ap.add_argument("--heads", required=True)
    ap.add_argument("--tree", default=None, help="JSON list of rank paths (default: the heads folder's tree)")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="timed runs per prompt and method (median taken)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--out", default=None, help="folder for results.json and results.md")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path = resolve_target(args.target)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    heads = dh.load_heads(args.heads, target=target)
    tree = json.loads(args.tree) if args.tree else None
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
    shape = decoder.proposer.shape

    texts = [t for t in corpus_texts("heldout") if len(t) > 2000][: args.num_prompts]
    prompts = [tokenizer(t, return_tensors="pt").input_ids[:, : args.prompt_tokens] for t in texts]

    def plain(ids):
        return target.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.max_new_tokens,
            min_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
        )

    def ours(ids):
        return decoder.generate(ids, max_new_tokens=args.max_new_tokens, temperature=0.0, eos_token_id=[])

    with torch.inference_mode():
        plain(prompts[0]), ours(prompts[0])  # warm-up, not timed
        rows = []
        for i, ids in enumerate(prompts):
            plain_s, ours_s = [], []
            for r in range(args.rounds):  # alternate the order so drifts hit both methods alike
                for method in ((plain, ours) if r % 2 == 0 else (ours, plain)):
                    t0 = time.perf_counter()
                    result = method(ids)
                    (plain_s if method is plain else ours_s).append(time.perf_counter() - t0)
                    if method is plain:
                        ref = result
                    else:
                        out = result
            t_plain, t_ours = statistics.median(plain_s), statistics.median(ours_s)
            steps = len(out.accept_lengths)
            rows.append({
                "prompt": i,
                "plain_tok_s": args.max_new_tokens / t_plain,
                "ours_tok_s": args.max_new_tokens / t_ours,
                "speedup": t_plain / t_ours,
                "accept_length": out.mean_accept_length,
                "overhead_ms_per_step": 1000 * (out.decode_seconds - out.target_seconds) / steps,
                "target_ms_per_step": 1000 * out.target_seconds / steps,
                "exact": bool(torch.equal(ref, out.sequences)),
            })
            r = rows[-1]
            print(f"prompt {i:2d}: plain {r['plain_tok_s']:6.1f} tok/s  ours {r['ours_tok_s']:6.1f} tok/s  "
                  f"speedup {r['speedup']:.2f}x  accepted {r['accept_length']:.2f}/step  exact {r['exact']}")
        verify = measure_verify_times(target, sorted({1, shape.size}), context=args.prompt_tokens + args.max_new_tokens // 2)

    accept = statistics.mean(r["accept_length"] for r in rows)
    ideal = accept * verify[1] / verify[shape.size]
    speed = quantiles([r["speedup"] for r in rows])
    summary = {
        "target": path, "heads": args.heads, "tree": [list(c) for c in shape.choices], "tree_nodes": shape.size,
        "prompts": len(rows), "rounds": args.rounds, "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
        "all_exact": all(r["exact"] for r in rows),
        "speedup": speed,
        "plain_tok_s": quantiles([r["plain_tok_s"] for r in rows]),
        "ours_tok_s": quantiles([r["ours_tok_s"] for r in rows]),
        "mean_accept_length": accept,
        "overhead_ms_per_step": quantiles([r["overhead_ms_per_step"] for r in rows]),
        "target_ms_per_step": quantiles([r["target_ms_per_step"] for r in rows]),
        "verify_ms": {n: 1000 * s for n, s in verify.items()},
        "ideal_speedup": ideal,
        "fraction_of_ideal": speed["median"] / ideal,
        "env": {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
                "machine": platform.machine(), "device": str(target.device)},
        "rows": rows,
    }
    table = "\n".join([
        "| metric | median | spread (min / q1 / q3 / max) |",
        "|---|---|---|",
        *(f"| {name} | {summary[key]['median']:.2f} | {summary[key]['min']:.2f} / {summary[key]['q1']:.2f} / "
          f"{summary[key]['q3']:.2f} / {summary[key]['max']:.2f} |"
          for name, key in [("speedup vs plain generate", "speedup"), ("plain tokens/s", "plain_tok_s"),
                            ("draftheads tokens/s", "ours_tok_s"), ("target forward ms/step", "target_ms_per_step"),
                            ("outside-forward ms/step", "overhead_ms_per_step")]),
    ])
    print()
    print(table)
    print(f"\nmean accepted tokens per step {accept:.2f}; tree {shape.size} nodes; one-token forward "
          f"{1000 * verify[1]:.2f} ms, tree forward {1000 * verify[shape.size]:.2f} ms; ideal speedup {ideal:.2f}x; "
          f"reached {100 * summary['fraction_of_ideal']:.0f}% of ideal; all outputs exact: {summary['all_exact']}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
        (out / "results.md").write_text(table + "\n")


if __name__ == "__main__":
    main()
