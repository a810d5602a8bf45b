"""Loading the frozen target: the one place that turns a name into a model and its tokenizer.

Every command (training, feature caching, generate, bench, calibrate, import) loads its target
here, so the dtype rule (`device.resolve_dtype`), the "demo" name and the frozen state are the
same everywhere.
"""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch

from .demo import resolve_target
from .device import default_device, resolve_dtype


def load_target(
    name_or_path: str,
    *,
    device: torch.device | str | None = None,
    dtype: str = "auto",
    runs_on: torch.device | str | None = None,
    trust_remote_code: bool = False,
    revision: str | None = None,
    attn_implementation: str | None = "sdpa",
    resolving: ContextManager | None = None,
):
    """The frozen target (eval mode, no gradients) and its tokenizer.

    ``device``: load the weights straight onto it (None: leave them on the CPU, e.g. for ZeRO-3 to
    shard). ``runs_on``: the device the dtype is chosen for (default: ``device``, else the default
    device). ``resolving``: a context held while "demo" is resolved (the demo target is built on
    first use; under several processes only the main one should build it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with resolving or contextlib.nullcontext():
        path = resolve_target(name_or_path)
    device = torch.device(device) if device is not None else None
    common: dict[str, Any] = {"trust_remote_code": trust_remote_code, "revision": revision}
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, runs_on or device or default_device()), **common}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if device is not None and device.type != "cpu":
        kwargs["device_map"] = {"": device}  # straight onto the accelerator, not through host RAM
    target = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(path, **common)
    target.requires_grad_(False)
    return target.eval(), tokenizer
