"""The one entry behind ``train.py`` and ``draftheads train``: same flags, same error handling.

Errors a user can fix (config keys, the output folder, a checkpoint that does not fit, a run that
diverged) are printed as one ``error: ...`` line with a non-zero exit, not as a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--config", required=True, help="experiment YAML, e.g. configs/smollm2.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint (train.resume=auto)")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="replace the previous run in train.output_dir (its checkpoints, heads, best, metrics)",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides, e.g. train.max_steps=100")
    return parser


def run_command(args: argparse.Namespace) -> int:
    """Load the config, train, print where the heads went; 2 for a setup error, 1 for a failed run."""
    from ..config import ConfigError, load_config
    from .checkpoint import CheckpointError
    from .run_dir import RunFolderError
    from .stability import TrainingDiverged

    overrides = list(args.overrides) + (["train.resume=auto"] if args.resume else [])
    try:
        cfg = load_config(args.config, overrides)
        from .loop import run

        result = run(cfg, overwrite=args.overwrite)
    except (ConfigError, RunFolderError, FileNotFoundError, ValueError) as e:  # bad settings or data: named
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (TrainingDiverged, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if os.environ.get("RANK", "0") != "0":
        return 0
    final = result.metrics.get("final_eval") or {}
    if "eval/acceptance_length" in final:
        print(f"final eval: simulated chain acceptance {final['eval/acceptance_length']:.3f} tokens/step")
    print(f"heads: {result.heads_dir}")
    return 0
