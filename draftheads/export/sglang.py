"""Heads -> folders SGLang loads as ``--speculative-draft-model-path DIR``.

EAGLE -> ``LlamaForCausalLMEagle`` (sglang/srt/models/llama_eagle.py): its fc ALWAYS has a bias
(an absent one would stay at its random init), so heads without one get an explicit zero bias.
EAGLE-3 -> ``LlamaForCausalLMEagle3`` (sglang/srt/models/llama_eagle3.py): layer 0 as
``midlayer.*``; a later layer's pre-attention norm is its ``hidden_norm``; explicit aux ids count
"the output of layer j" (SGLang adds 1), one less than draftheads' feature layers.
SGLang skips unknown tensor names silently, as vLLM does.
"""
from __future__ import annotations

import torch

from .common import EngineFolder, ExportError, check_tensors, dtype_name, llama_layer_config
from .eagle_layers import engine_layer_tensors
from .layouts import eagle1_shapes, sglang_aux_ids
from .speculators import eagle3_tensors, expected_eagle3

FORMAT = "sglang"


def export_eagle(heads, *, verifier, verifier_cfg, num_speculative_tokens) -> EngineFolder:
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


def export_eagle3(heads, *, verifier, verifier_cfg, num_speculative_tokens) -> EngineFolder:
    heads.check_vocab_mapping()
    cfg, ex = heads.config, heads.config.extra
    on = [key for key in ("norm_before_fc", "fc_norm", "norm_output") if ex.get(key)]
    if on:  # not seen in sglang/srt/models/llama_eagle3.py, which skips unknown tensors without a word
        raise ExportError(
            f"{', '.join(on)} (EAGLE 3.1): SGLang's LlamaForCausalLMEagle3 is not known to compute it, and it would "
            "drop input_norm / fc_norm weights silently and serve another draft; export with --format vllm (or "
            "speculators)"
        )
    n_target = cfg.target.num_hidden_layers if cfg.target else int(verifier_cfg.get("num_hidden_layers", 0))
    ids = sglang_aux_ids(ex["feature_layers"], n_target)
    if len(ids) == 1:
        raise ExportError(
            "EAGLE-3 heads fusing a single target layer: SGLang applies fc only when the input is wider than the "
            "hidden size, so it would skip it; export with --format vllm"
        )
    tensors = eagle3_tensors(heads, "midlayer", "hidden_norm")
    config = llama_layer_config(cfg, verifier_cfg, cfg.num_layers)
    config.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": ex["draft_vocab_size"],
        "target_hidden_size": cfg.hidden_size,
        "num_aux_hidden_states": len(ids),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "bias": False,
        "torch_dtype": dtype_name(tensors),
    })
    folder = EngineFolder(config, tensors, [
        f"SGLang aux ids {ids} (output of layer j) from draftheads feature_layers {ex['feature_layers']} (input of layer f)"
    ])
    check_tensors(folder, expected_eagle3(heads, "midlayer", "hidden_norm"), "SGLang EAGLE-3")
    return folder
