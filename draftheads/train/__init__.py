"""Training draft heads on a frozen target: the Trainer (an accelerate recipe), chunked losses, metrics, checkpoints."""
from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .loop import TrainResult, run
    from .head_loss import HeadLoss, HeadLossOutput, LossBatch, LossSettings
    from .metrics import HeadStats, chain_acceptance_length
    from .model import TargetWithHeads
    from .trainer import Trainer

__all__ = [
    "HeadLoss",
    "HeadLossOutput",
    "HeadStats",
    "TargetWithHeads",
    "TrainResult",
    "Trainer",
    "chain_acceptance_length",
    "LossBatch",
    "LossSettings",
    "run",
]


# torch, accelerate and transformers load on first use: `draftheads train --help` needs none
__getattr__, __dir__ = lazy_exports(__name__, {
    "HeadLoss": ".head_loss", "HeadLossOutput": ".head_loss", "LossBatch": ".head_loss", "LossSettings": ".head_loss",
    "HeadStats": ".metrics", "chain_acceptance_length": ".metrics",
    "TargetWithHeads": ".model", "run": ".loop", "TrainResult": ".loop", "Trainer": ".trainer",
})
