"""What each way of spreading training over processes needs from the recipe, in one place.

The launcher's accelerate config picks the way (plain DDP, DeepSpeed ZeRO-2/3); ``Parallelism``
answers the few questions where they differ: where the target is loaded, how a parameter is
counted, what ``prepare`` needs first, and how whole heads are read back.
"""
from __future__ import annotations

import torch
from accelerate.utils import DistributedType

from ..config import HeadsSpec
from .checkpoint import heads_from_state, heads_state, register_heads_only


class Parallelism:
    """The launch's data-parallel flavour, as the Trainer needs it."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator
        self.deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
        self.zero3 = self.deepspeed and accelerator.state.deepspeed_plugin.zero_stage == 3

    def target_device(self) -> torch.device | None:
        """Where to load the target: straight onto the GPU (not through host RAM once per
        process), unless ZeRO-3 shards it; None: the loader's default."""
        device = self.accelerator.device
        return device if device.type == "cuda" and not self.zero3 else None

    def check_heads(self, spec: HeadsSpec) -> None:
        """Refuse heads this launch cannot train, before they are built (every launch here can)."""

    @staticmethod
    def numel(p: torch.Tensor) -> int:
        return getattr(p, "ds_numel", None) or p.numel()  # ZeRO-3 shards leave p.numel() == 0

    def before_prepare(self, model: torch.nn.Module, max_grad_norm: float | None) -> None:
        """DeepSpeed clips inside its engine (its config's ``gradient_clipping``, from
        ``train.max_grad_norm`` unless set) and leaves frozen weights out of checkpoints itself;
        elsewhere the checkpoint hook drops the frozen target's weights."""
        if self.deepspeed:
            ds_config = self.accelerator.state.deepspeed_plugin.deepspeed_config
            if ds_config.get("gradient_clipping", "auto") == "auto":
                ds_config["gradient_clipping"] = float(max_grad_norm or 0.0)
        else:
            register_heads_only(self.accelerator)

    def tree_skip_reason(self) -> str | None:
        """Why the heads' tree cannot be chosen by timing decoding at the end of this run, or None."""
        return "ZeRO-3 shards the target across processes" if self.zero3 else None

    def whole_heads(self, model: torch.nn.Module) -> torch.nn.Module:
        """The trained heads, whole, on every process (a collective under ZeRO-3)."""
        heads = self.accelerator.unwrap_model(model).heads
        if self.zero3:  # each process holds shards: return whole heads, like every other setup
            heads = heads_from_state(heads, heads_state(self.accelerator, model, everywhere=True))
        return heads
