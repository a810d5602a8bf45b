"""`draftheads cache-features`: run the target once over a config's data and store what the heads
read (see ``features.py``); then train with ``data.features=DIR``."""
from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "cache-features",
        help="precompute the target features the heads read, for training with data.features=DIR",
        description="Run the frozen target once over the config's train/eval data and store its last hidden "
        "state (EAGLE-3: its feature layers) and greedy labels as sharded safetensors. Resumable.",
    )
    p.add_argument("--config", required=True, help="the experiment YAML you will train with")
    p.add_argument("--out", required=True, help="cache folder (new or an interrupted cache to finish)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                   help="storage dtype of the features (float32: training equals online training exactly)")
    p.add_argument("--batch-size", type=int, default=8, help="examples per target forward")
    p.add_argument("--shard-mb", type=int, default=1024, help="approximate size of one shard file")
    p.add_argument("--device", default=None, help="cuda, cpu (default: cuda if available)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, as for train")
    p.set_defaults(func=run_cache_features)
    return p


def run_cache_features(args) -> int:
    import torch

    from ..config import ConfigError, load_config
    from ..data import Collator, build_datasets
    from .components import build_heads, load_target
    from .features import FeatureCacheError, build_cache
    from .model import TargetWithHeads

    if args.batch_size < 1 or args.shard_mb < 1:
        print("error: --batch-size and --shard-mb must be >= 1", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if cfg.data.features:
        print("note: data.features is ignored here (the cache is what this command writes)")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    target, tokenizer = load_target(cfg.target, device=device if device.type != "cpu" else None)
    train_ds, eval_ds, stats = build_datasets(cfg.data, tokenizer)
    print(stats.summary())
    torch.manual_seed(cfg.train.seed)
    heads = build_heads(cfg.heads, target, tokenizer=tokenizer)  # only to learn what these heads read from the target
    model = TargetWithHeads(target, heads, loss_chunk_size=cfg.train.loss_chunk_size)
    splits = {"train": train_ds} | ({"eval": eval_ds} if eval_ds is not None else {})
    try:
        build_cache(
            cfg, args.out, model, tokenizer, splits, dtype=args.dtype, batch_size=args.batch_size,
            shard_bytes=args.shard_mb << 20, collate=Collator.from_tokenizer(tokenizer), progress=not args.no_progress,
        )
    except FeatureCacheError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"train with: data.features={args.out}")
    return 0
