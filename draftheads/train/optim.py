"""The optimizer and learning-rate schedule of a training run, from the ``train:`` config.

AdamW on the heads' parameters with ``train.adam_betas``, and one of three schedules after a
linear warmup of ``train.warmup_steps``: "cosine" (half a cosine down to zero at the last step),
"linear" (a straight line down to zero at the last step: what DeepSpeed's WarmupDecayLR, the
schedule of the EAGLE-3 authors' trainer, does) or "constant". The gradient-clip norm
(``train.max_grad_norm``) is applied by the loop, which knows where a step's gradients are final.
"""
from __future__ import annotations

from typing import Iterable

import torch
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

SCHEDULES = ("cosine", "linear", "constant")


def build_optimizer(params: Iterable[torch.nn.Parameter], train_cfg) -> torch.optim.Optimizer:
    """AdamW over ``params`` with the configured lr, betas and weight decay."""
    beta1, beta2 = train_cfg.adam_betas
    return torch.optim.AdamW(params, lr=train_cfg.lr, betas=(float(beta1), float(beta2)), weight_decay=train_cfg.weight_decay)


def build_scheduler(optimizer: torch.optim.Optimizer, train_cfg, max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The configured schedule over ``max_steps`` optimizer steps, warmup included (capped at ``max_steps``)."""
    warmup = min(train_cfg.warmup_steps, max_steps)
    name = train_cfg.lr_schedule
    if name == "cosine":
        return get_cosine_schedule_with_warmup(optimizer, warmup, max_steps)
    if name == "linear":
        return get_linear_schedule_with_warmup(optimizer, warmup, max_steps)
    if name == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    raise ValueError(f"train.lr_schedule: unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
