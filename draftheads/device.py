"""Hardware and launcher detection: devices, dtypes, mixed precision and the right ``Accelerator`` arguments.

The launcher traps live here so the training loop does not carry them (see the CPU stack notes):

- multi-process DDP without CUDA needs ``Accelerator(cpu=True)``; a plain ``Accelerator()`` there
  runs N independent single-process trainings;
- DeepSpeed without CUDA must NOT get ``cpu=True`` (that silently drops DeepSpeed and runs DDP);
  it needs the gloo backend instead.
"""
from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def cuda_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(name: str, device: torch.device | str | None = None) -> torch.dtype:
    """The dtype of a target that runs on ``device`` (None: CUDA when available, else the CPU).

    One rule for every command that loads a target (train, cache-features, generate, bench,
    calibrate, import), so heads are trained on the features they later draft from. ``"auto"``:
    bf16 on a CUDA device that supports it; fp16 on a CUDA device that does not (pre-Ampere GPUs
    run fp32 at a fraction of their fp16 speed); fp32 elsewhere (CPUs here lack fast bf16).
    An explicit name is honoured as given."""
    if name == "auto":
        kind = torch.device(device).type if device is not None else default_device().type
        if kind != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; valid: auto, {', '.join(_DTYPES)}") from None


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU model ("AMD EPYC", "Intel(R) Xeon(R) CPU @ 2.20GHz"), read once per process."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: torch.device | str) -> str:
    """The machine a measurement on ``device`` describes: the GPU's name on CUDA, else the CPU
    model. Plans record it (tree.json's ``device_name``) because the cost of verifying n tokens
    differs between machines of one device type."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cuda"
    if device.type != "cpu":
        return device.type  # mps, xpu, ...: no model name to read here
    return cpu_name()


def resolve_mixed_precision(name: str) -> str:
    """``"auto"``: bf16 autocast on CUDA with bf16 support, none otherwise."""
    if name == "auto":
        return "bf16" if cuda_bf16() else "no"
    return name


@dataclass(frozen=True)
class LaunchEnv:
    """What the launcher (``accelerate launch``, ``torchrun`` or plain ``python``) set up."""

    world_size: int
    deepspeed: bool
    cuda: bool

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launch_env() -> LaunchEnv:
    return LaunchEnv(
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        deepspeed=os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes"),
        cuda=torch.cuda.is_available(),
    )


def accelerator_kwargs(env: LaunchEnv | None = None) -> dict:
    """Arguments for ``Accelerator`` that make the current launch do what it was asked to."""
    from accelerate.utils import InitProcessGroupKwargs

    env = env or launch_env()
    if env.cuda:
        return {}
    if env.deepspeed:
        return {"kwargs_handlers": [InitProcessGroupKwargs(backend="gloo")]}
    if env.distributed:
        return {"cpu": True}
    return {}


def cpu_threads_for_single_process(env: LaunchEnv | None = None) -> int | None:
    """Threads a lone CPU process should use, or None to leave torch's setting alone.

    `accelerate launch` without a config exports OMP_NUM_THREADS=1 to its child, which leaves all
    but one core idle in a single-process CPU run. One process alone gets every core, unless the
    user pins it with DRAFTHEADS_NUM_THREADS."""
    env = env or launch_env()
    if env.cuda or env.distributed:
        return None
    pinned = os.environ.get("DRAFTHEADS_NUM_THREADS")
    if pinned:
        return max(1, int(pinned))
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
