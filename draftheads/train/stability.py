"""Stop a diverged run instead of exporting NaN heads.

A step whose loss is not finite (on any process) does not update the heads: one bad batch (an
overflow in a low-precision forward, a degenerate row) is skipped without harm. ``limit``
consecutive such steps mean the weights or the learning rate are broken (with ``lr=inf`` the
first update already makes every weight inf, and no later batch recovers from that), so the run
stops with ``TrainingDiverged``, before anything is exported.

Under DeepSpeed the engine applies the update inside ``backward``; a step cannot be skipped from
outside, so the first non-finite step stops the run there (limit 1).
"""
from __future__ import annotations

import torch

MAX_NONFINITE_STEPS = 3


class TrainingDiverged(RuntimeError):
    """The loss stayed non-finite: the run stopped and exported nothing."""


class NonFiniteGuard:
    """Counts consecutive optimizer steps whose loss was non-finite on some process."""

    def __init__(self, limit: int = MAX_NONFINITE_STEPS) -> None:
        self.limit = limit
        self.consecutive = 0
        self.skipped = 0
        self._pending = False  # a non-finite micro-batch since the last optimizer step

    def add(self, loss: torch.Tensor) -> None:
        """Note one micro-batch's loss (local; no collective)."""
        if not bool(torch.isfinite(loss.detach()).all()):
            self._pending = True

    def step_is_bad(self, accelerator, step: int, lr: float) -> bool:
        """At an optimizer step (a collective: call on every process): True if some process saw a
        non-finite loss since the last step, so the update must be skipped. Raises after
        ``limit`` bad steps in a row."""
        flag = torch.tensor(float(self._pending), device=accelerator.device)
        self._pending = False
        bad = accelerator.reduce(flag, reduction="sum").item() > 0
        if not bad:
            self.consecutive = 0
            return False
        self.consecutive += 1
        self.skipped += 1
        if self.consecutive >= self.limit:
            raise TrainingDiverged(
                f"training diverged: the loss was not finite (NaN or inf) for {self.consecutive} consecutive "
                f"step(s), up to step {step} (learning rate {lr:g}); nothing was exported. Lower train.lr, "
                "check the data and mixed precision, or resume from an earlier checkpoint"
            )
        accelerator.print(
            f"warning: step {step}: non-finite loss, update skipped "
            f"({self.consecutive}/{self.limit} in a row before the run stops)"
        )
        return True
