"""Train draft heads on a frozen causal LM.

    accelerate launch train.py --config configs/smollm2.yaml [key.sub=value ...] [--resume | --overwrite]
    python train.py --config configs/smollm2.yaml train.max_steps=50       # single process, no launcher

The accelerate config (``--config_file configs/accelerate/...``) chooses single device, DDP or
DeepSpeed ZeRO; this script and ``draftheads train`` share one entry (draftheads.train.command).
"""
from __future__ import annotations

import argparse
import sys

from draftheads.train.command import add_arguments, run_command


def main(argv: list[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(description="Train speculative-decoding draft heads on a frozen target."))
    return run_command(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
