"""What each way of spreading training over processes needs from the recipe, in one place.

The launcher's accelerate config picks the way (plain DDP, DeepSpeed ZeRO-2/3, FSDP);
``Parallelism`` answers the few questions where they differ: where the target is loaded, how a
parameter is counted, what ``prepare`` needs first, which parameters clipping sees, and how whole
heads are read back.

FSDP shards the trainable heads only. ``prepare`` wraps the whole ``TargetWithHeads`` in ONE
FSDP unit whose ``ignored_modules`` is the frozen target: the target's weights stay ordinary,
replicated tensors on every process (no flat parameter, no all-gather per forward; they never
receive gradients, so there is nothing to reduce-scatter either), while the heads' parameters
become one flat parameter sharded across processes. No nested units: the losses call the
heads' methods (``logits``, ``run_layers``...) inside the root's forward, where only the root
unit has gathered them. With ``FULL_SHARD`` the root keeps the gathered heads from forward to
backward (FSDP never reshards the root after forward), so ``SHARD_GRAD_OP`` differs from it
only in when gradients and optimizer state are sharded, which on heads this small is the same.

accelerate (1.15) turns FSDP on only for an accelerator device: without CUDA it silently runs
DDP instead (``AcceleratorState`` sets ``DistributedType.FSDP`` only inside its
``MULTI_GPU/MULTI_NPU/...`` branch, and a CPU launch is ``MULTI_CPU``). A CPU launch that asked
for FSDP (``ACCELERATE_USE_FSDP=true``, set by ``accelerate launch`` from ``distributed_type:
FSDP``) is switched back to FSDP here, on the gloo group accelerate made, so CPU tests run the
same code as GPU runs.
"""
from __future__ import annotations

import os

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from ..config import HeadsSpec
from .checkpoint import heads_from_state, heads_state, register_heads_only
from .model import TargetWithHeads

#: What accelerate's FSDP settings must be for draftheads, and why (refused otherwise, by name).
FSDP_REQUIREMENTS = {
    "fsdp_version": "1 (FSDP2 is not wired into draftheads yet: its per-module units would leave the heads' "
                    "methods, called inside the root forward, on sharded parameters)",
    "activation_checkpointing": "false (the losses already checkpoint their vocabulary-sized chunks)",
    "state_dict_type": "SHARDED_STATE_DICT (checkpoints are per-process shards, resumed exactly by the same "
                       "number of processes; the exported heads/ folder is always whole)",
}


class FSDPSetupError(ValueError):
    """An FSDP setting draftheads cannot train with, and what to set instead."""


def fsdp_requested() -> bool:
    """The launcher asked for FSDP (``distributed_type: FSDP`` in the accelerate config)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true", "yes")


class Parallelism:
    """The launch's data-parallel flavour, as the Trainer needs it."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator
        if fsdp_requested() and accelerator.distributed_type == DistributedType.MULTI_CPU:
            _fsdp_on_cpu(accelerator)
        self.deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
        self.zero3 = self.deepspeed and accelerator.state.deepspeed_plugin.zero_stage == 3
        self.fsdp = accelerator.distributed_type == DistributedType.FSDP
        if self.fsdp:
            check_fsdp_plugin(accelerator.state.fsdp_plugin)

    def target_device(self) -> torch.device | None:
        """Where to load the target: straight onto the GPU (not through host RAM once per
        process), unless ZeRO-3 shards it; None: the loader's default."""
        device = self.accelerator.device
        return device if device.type == "cuda" and not self.zero3 else None

    def check_heads(self, spec: HeadsSpec) -> None:
        """Refuse heads this launch cannot train, before they are built. Every head type trains
        under FSDP (the heads are one flat parameter whatever their layout); continuing from
        heads.init_from does too (the heads are loaded whole before they are sharded)."""

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
            return
        if self.fsdp:  # one unit over the heads; the frozen target is left out (replicated)
            plugin = self.accelerator.state.fsdp_plugin
            plugin.auto_wrap_policy = None
            plugin.ignored_modules = [model.target]
            self.heads_numel = sum(p.numel() for p in model.heads.parameters())  # before FSDP flattens them
            return
        register_heads_only(self.accelerator)

    def describe(self, model: torch.nn.Module) -> str | None:
        """One line on how the prepared model is spread over processes (FSDP only), from the
        wrapped model itself: what is sharded, what is replicated."""
        if not self.fsdp:
            return None
        core = self.accelerator.unwrap_model(model)
        local = sum(p.numel() for p in model.parameters() if p.requires_grad)
        target = sum(p.numel() for p in core.target.parameters())
        return (
            f"FSDP: the heads' {self.heads_numel} parameters sharded over {self.accelerator.num_processes} processes "
            f"({local} on this one); the frozen target's {target} parameters replicated on every process"
        )

    def before_resume(self, optimizer) -> None:
        """FSDP reads a sharded optimizer state into the entries the optimizer already has (the
        checkpoint reader fills a template made from the current state): a fresh AdamW has none,
        so it would resume with its moments and step count silently reset. Give it its zero
        state first; the load overwrites every entry."""
        if not self.fsdp:
            return
        opt = getattr(optimizer, "optimizer", optimizer)
        for group in opt.param_groups:
            for p in group["params"]:
                if not opt.state[p]:
                    opt.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}

    def optimizer_parameters(self, model: torch.nn.Module, params: list[torch.nn.Parameter]):
        """What the optimizer must hold. Under FSDP the gradients live on the sharded flat
        parameter that replaced the heads' own: the wrapped model's trainable parameters."""
        return [p for p in model.parameters() if p.requires_grad] if self.fsdp else params

    def clip_parameters(self, model: torch.nn.Module, params: list[torch.nn.Parameter]):
        """What ``clip_grad_norm_`` must be handed: accelerate uses FSDP's own clipping (the norm
        over every shard) only when handed exactly the wrapped model's parameters."""
        return list(model.parameters()) if self.fsdp else params

    def tree_skip_reason(self) -> str | None:
        """Why the heads' tree cannot be chosen by timing decoding at the end of this run, or None."""
        return "ZeRO-3 shards the target across processes" if self.zero3 else None

    def whole_heads(self, model: torch.nn.Module) -> torch.nn.Module:
        """The trained heads, whole, on every process (a collective under ZeRO-3 and FSDP)."""
        core = self.accelerator.unwrap_model(model)
        heads = core.heads
        if self.zero3 or self.fsdp:  # each process holds shards: return whole heads, like every other setup
            heads = heads_from_state(heads, heads_state(self.accelerator, model, everywhere=True))
        if self.fsdp:  # decodable at once (the tree choice times them against the target)
            heads.bind_target(core.target)
        return heads

    def model_for_tree(self, model: torch.nn.Module, whole_heads: torch.nn.Module) -> torch.nn.Module:
        """The model the tree choice decodes with: under FSDP the wrapped heads are shards, so
        the target beside the whole heads; otherwise the trained model itself."""
        if not self.fsdp:
            return model
        return TargetWithHeads(self.accelerator.unwrap_model(model).target, whole_heads)


def _fsdp_on_cpu(accelerator) -> None:
    """Make a CPU launch that asked for FSDP run FSDP (see the module docstring)."""
    state = accelerator.state
    for shared in (state._shared_state, PartialState._shared_state):  # as AcceleratorState keeps them in step
        shared["distributed_type"] = DistributedType.FSDP
        # MULTI_CPU names the device "cpu:0", which FSDP refuses beside parameters on "cpu"
        shared["device"] = torch.device("cpu")
    state.fsdp_plugin = FullyShardedDataParallelPlugin()  # read from the launcher's FSDP_* environment


def check_fsdp_plugin(plugin: FullyShardedDataParallelPlugin) -> None:
    """Refuse FSDP settings draftheads cannot train with, naming each and what to set."""
    problems = []
    if plugin.fsdp_version != 1:
        problems.append(f"fsdp_version is {plugin.fsdp_version}; set {FSDP_REQUIREMENTS['fsdp_version']}")
    if plugin.activation_checkpointing:
        problems.append(f"activation_checkpointing is on; set {FSDP_REQUIREMENTS['activation_checkpointing']}")
    state_dict_type = getattr(plugin.state_dict_type, "name", str(plugin.state_dict_type))
    if state_dict_type != "SHARDED_STATE_DICT":
        problems.append(f"state_dict_type is {state_dict_type}; set {FSDP_REQUIREMENTS['state_dict_type']}")
    if problems:
        raise FSDPSetupError(
            "FSDP: draftheads cannot train with these accelerate settings:\n  - " + "\n  - ".join(problems)
            + "\nSee configs/accelerate/fsdp.yaml"
        )
