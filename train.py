"""Train draft heads on a frozen causal LM.

    accelerate launch train.py --config configs/demo.yaml [key.sub=value ...] [--resume]
    python train.py --config configs/demo.yaml train.max_steps=50       # single process, no launcher

The accelerate config (``--config_file configs/accelerate/...``) chooses single device, DDP or
DeepSpeed ZeRO; this script and ``draftheads.train.loop.run`` are the same in every case.
"""
from __future__ import annotations

import argparse
import os
import sys

from draftheads.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train speculative-decoding draft heads on a frozen target.")
    parser.add_argument("--config", required=True, help="experiment YAML, e.g. configs/demo.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint (train.resume=auto)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. train.max_steps=100")
    args = parser.parse_args(argv)
    overrides = list(args.overrides) + (["train.resume=auto"] if args.resume else [])
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from draftheads.train.loop import run

    result = run(cfg)
    if os.environ.get("RANK", "0") != "0":
        return 0
    final = result.metrics.get("final_eval") or {}
    if "eval/acceptance_length" in final:
        print(f"final eval: simulated chain acceptance {final['eval/acceptance_length']:.3f} tokens/step")
    print(f"heads: {result.heads_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
