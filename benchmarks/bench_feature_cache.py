"""Heads-training throughput: online (target forward every step) vs from the feature cache.

    python benchmarks/bench_feature_cache.py [--heads medusa,eagle] [--layers 12 --hidden 512] \
        [--out benchmarks/measurements/feature-cache]

On a random-weight Llama (default 12 layers x 512, BPE vocab 4098) whose forward dominates a
step, as a 7B target's does: builds the cache once (``draftheads cache-features``, timed), then
trains the same config online and with ``data.features`` back to back, alternating, ``--pairs``
times per head type, and reports ``train_tokens_per_second`` (padded positions per second of
training steps, evaluation excluded) with the per-pair ratio cached/online. fp32 cache, so both
runs train the very same heads. Absolute figures depend on the machine's load; the ratio of
back-to-back runs much less.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_setup import chat_rows, make_target, make_tokenizer, write_jsonl  # noqa: E402


def config(target: Path, data: Path, head_type: str, out: Path, args) -> dict:
    heads = {"head_type": head_type, "num_heads": 3 if head_type in ("medusa", "hydra") else 1, "num_layers": 1}
    if head_type in ("medusa", "hydra"):
        heads["lm_head"] = "own"
    return {
        "target": {"name_or_path": str(target), "dtype": "float32"},
        "heads": heads,
        # eval_overlap: warn: Spec-Bench questions as throughput material for random weights, never benchmarked on
        "data": {"path": str(data), "format": "sharegpt", "max_length": args.max_length, "eval_fraction": 0.0,
                 "eval_overlap": "warn",
                 "cache_dir": str(out / "hf-cache")},
        "train": {"output_dir": str(out / "run"), "max_steps": args.steps, "batch_size": args.batch_size,
                  "eval_every": 0, "save_every": 0, "log_every": args.steps, "mixed_precision": "no",
                  "group_by_length": True, "labels": "target" if head_type == "medusa" else "data"},
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", default="medusa,eagle")
    p.add_argument("--out", default="benchmarks/measurements/feature-cache")
    p.add_argument("--work", default="/tmp/draftheads-bench-scale")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    os.environ["DRAFTHEADS_NUM_THREADS"] = str(args.threads)
    import torch
    import yaml

    from draftheads.cli import main as cli
    from draftheads.config import config_from_dict
    from draftheads.train.loop import run

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    tok = make_tokenizer(work / "tokenizer")
    target = make_target(work / f"llama-{args.layers}x{args.hidden}", tok, layers=args.layers, hidden=args.hidden)
    data = write_jsonl(work / f"chat-{args.rows}.jsonl", chat_rows(args.rows, seed=1))
    results = {"target": f"random Llama {args.layers}x{args.hidden}, vocab {len(tok)}, fp32, sdpa, {args.threads} thread(s)",
               "command": " ".join(sys.argv), "heads": {}}
    for head_type in args.heads.split(","):
        out = work / f"bench-{head_type}"
        cfg = config(target, data, head_type, out, args)
        cfg_path = out / "cfg.yaml"
        out.mkdir(parents=True, exist_ok=True)
        cfg_path.write_text(yaml.safe_dump(cfg))
        cache = out / "features"
        if cache.exists():
            import shutil

            shutil.rmtree(cache)
        start = time.perf_counter()
        assert cli(["cache-features", "--config", str(cfg_path), "--out", str(cache), "--dtype", "float32",
                    "--batch-size", str(args.batch_size), "--no-progress"]) == 0
        cache_seconds = time.perf_counter() - start
        online, cached, equal = [], [], []
        for pair in range(args.pairs):
            runs = {}
            for mode in (("online", "cached") if pair % 2 == 0 else ("cached", "online")):
                overrides = [f"data.features={cache}"] if mode == "cached" else []
                runs[mode] = run(config_from_dict(cfg, overrides), overwrite=True)  # the same scratch folder each time
            online.append(runs["online"].metrics["train_tokens_per_second"])
            cached.append(runs["cached"].metrics["train_tokens_per_second"])
            a, b = runs["online"].heads.state_dict(), runs["cached"].heads.state_dict()
            equal.append(all(torch.equal(a[k], b[k]) for k in a))
            print(f"{head_type} pair {pair + 1}: online {online[-1]:.0f} tok/s, cached {cached[-1]:.0f} tok/s, "
                  f"ratio {cached[-1] / online[-1]:.2f}, same heads: {equal[-1]}", flush=True)
        ratios = [c / o for c, o in zip(cached, online)]
        index = json.loads((cache / "index.json").read_text())
        size = sum(f.stat().st_size for f in cache.iterdir())
        results["heads"][head_type] = {
            "online_tokens_per_second": online,
            "cached_tokens_per_second": cached,
            "ratio_cached_over_online": ratios,
            "ratio_median": statistics.median(ratios),
            "same_heads_after_training": equal,
            "cache_build_seconds": cache_seconds,
            "cache_bytes": size,
            "cache_examples": index["splits"]["train"]["examples"],
        }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "feature-cache.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
