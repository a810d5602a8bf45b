"""Renaming an EAGLE draft's decoder layers between draftheads and the engines' Llama layer names."""
from __future__ import annotations

import torch

from .layouts import LAYER_NAMES


def engine_layer_tensors(state: dict[str, torch.Tensor], num_layers: int, prefixes: list[str],
                         later_norm: str = "input_layernorm") -> dict[str, torch.Tensor]:
    """draftheads ``layers.{i}.q_proj.weight`` ... -> ``{prefixes[i]}.self_attn.q_proj.weight`` ...;
    a later layer's input_layernorm is written as ``later_norm`` (SGLang's EAGLE-3 calls it hidden_norm)."""
    out = {}
    for i in range(num_layers):
        for mine, theirs in LAYER_NAMES.items():
            key = f"layers.{i}.{mine}"
            if key not in state:
                continue
            if mine == "input_layernorm.weight" and i > 0:
                theirs = f"{later_norm}.weight"
            out[f"{prefixes[i]}.{theirs}"] = state[key]
    return out


def draftheads_layer_tensors(state: dict[str, torch.Tensor], num_layers: int, prefixes: list[str],
                             later_norm: str = "input_layernorm") -> dict[str, torch.Tensor]:
    """The inverse of `engine_layer_tensors`; the engine tensors it used are removed from ``state``."""
    out = {}
    for i in range(num_layers):
        for mine, theirs in LAYER_NAMES.items():
            if mine == "input_layernorm.weight" and i > 0:
                theirs = f"{later_norm}.weight"
            key = f"{prefixes[i]}.{theirs}"
            if key in state:
                out[f"layers.{i}.{mine}"] = state.pop(key)
    return out
