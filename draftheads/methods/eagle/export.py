"""EAGLE-1/2 heads -> engine folders.

vLLM: its EAGLE-1 draft (llama_eagle.py: a LlamaForCausalLM-shaped config, fc without bias, no
input_layernorm on layer 0, no final norm, the target's embedding and LM head). SGLang:
``LlamaForCausalLMEagle`` (sglang/srt/models/llama_eagle.py): its fc ALWAYS has a bias (an absent
one would stay at its random init), so heads without one get an explicit zero bias. Both engines
skip tensors they do not expect without a word, so every tensor lands on a parameter or the export
is refused.
"""
from __future__ import annotations

import torch

from ...export.common import EngineFolder, check_tensors, drop_if_zero, dtype_name, llama_layer_config
from ...export.eagle_layers import engine_layer_tensors
from ...export.layouts import layer_shapes


def export_vllm(heads, *, verifier, verifier_cfg, num_speculative_tokens) -> EngineFolder:
    cfg = heads.config
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    if "fc.bias" in state:
        drop_if_zero(state["fc.bias"], "fc.bias", "vLLM's EAGLE-1 draft", "its fc is Linear(2H, H, bias=False)")
    tensors = {"fc.weight": state["fc.weight"]}
    tensors.update(engine_layer_tensors(state, cfg.num_layers, [f"layers.{i}" for i in range(cfg.num_layers)]))
    config = llama_layer_config(cfg, verifier_cfg, cfg.num_layers)
    config["architectures"] = ["LlamaForCausalLM"]  # vLLM wraps it as EagleLlamaForCausalLM
    config["torch_dtype"] = dtype_name(tensors)
    folder = EngineFolder(config, tensors, ["load with speculative_config={'method': 'eagle', 'model': DIR, ...}"])
    check_tensors(folder, eagle1_shapes(cfg, fc_bias=False), "vLLM EAGLE-1")
    return folder


def export_sglang(heads, *, verifier, verifier_cfg, num_speculative_tokens) -> EngineFolder:
    cfg = heads.config
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    tensors = {"fc.weight": state["fc.weight"]}
    tensors["fc.bias"] = state["fc.bias"] if "fc.bias" in state else torch.zeros(cfg.hidden_size, dtype=state["fc.weight"].dtype)
    tensors.update(engine_layer_tensors(state, cfg.num_layers, [f"layers.{i}" for i in range(cfg.num_layers)]))
    config = llama_layer_config(cfg, verifier_cfg, cfg.num_layers)
    config["architectures"] = ["LlamaForCausalLMEagle"]
    config["torch_dtype"] = dtype_name(tensors)
    notes = [] if "fc.bias" in state else ["fc.bias written as zeros (SGLang's EAGLE fc always has a bias)"]
    folder = EngineFolder(config, tensors, notes)
    check_tensors(folder, eagle1_shapes(cfg, fc_bias=True), "SGLang EAGLE-1")
    return folder


def eagle1_shapes(config, *, fc_bias: bool) -> dict:
    """vLLM (``fc_bias=False``) and SGLang (``fc_bias=True``) EAGLE-1 drafts; embedding and LM head
    are the target's (not stored)."""
    d, ex = config.hidden_size, config.extra
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (d, 2 * d)}
    if fc_bias:
        shapes["fc.bias"] = (d,)
    for i in range(config.num_layers):
        for name, shape in layer_shapes(ex, d, d, input_norm=i > 0).items():
            shapes[f"layers.{i}.{name}"] = shape
    return shapes
