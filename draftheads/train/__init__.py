"""Training draft heads on a frozen target: the accelerate loop, chunked losses, metrics, checkpoints."""
from .losses import HeadLossOutput, medusa_loss, medusa_targets
from .metrics import HeadStats, chain_acceptance_length
from .model import TargetWithHeads

__all__ = [
    "HeadLossOutput",
    "HeadStats",
    "TargetWithHeads",
    "TrainResult",
    "chain_acceptance_length",
    "medusa_loss",
    "medusa_targets",
    "run",
]


def __getattr__(name):
    # The loop imports accelerate/transformers; keep `import draftheads.train` light for the rest.
    if name in ("run", "TrainResult"):
        from . import loop

        return getattr(loop, name)
    raise AttributeError(name)
