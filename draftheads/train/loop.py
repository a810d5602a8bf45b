"""``run(cfg)``: train heads as configured. The recipe itself is ``trainer.Trainer``.

The building blocks that scripts and tests import from here keep this import path
(``build_heads``, ``load_target``, ``init_heads_from``: components.py; ``EvalShard``: evaluation.py).
"""
from __future__ import annotations

from ..config import ExperimentConfig
from .components import build_heads, init_heads_from, load_target
from .evaluation import EvalShard
from .trainer import Trainer, TrainResult

__all__ = ["EvalShard", "TrainResult", "Trainer", "build_heads", "init_heads_from", "load_target", "run"]


def run(cfg: ExperimentConfig, overwrite: bool = False) -> TrainResult:
    """Train heads as configured; return where they were exported and the final metrics.

    ``overwrite``: replace a previous run's files in ``train.output_dir`` (otherwise a fresh run
    into a folder that holds a run is refused; see run_dir.py). While it runs, the run holds the
    folder's lock (``RunLock``): a second run into it is refused at once."""
    return Trainer(cfg, overwrite=overwrite).run()
