"""EAGLE-1/2 checkpoints -> draftheads EagleHead, and what every EAGLE-style reader shares.

EAGLE-1/2 (SafeAILab ``cnets.py``; also vLLM's and SGLang's EAGLE-1 folders): ``fc`` over
cat(embedding, feature) (+ bias), ``layers.{i}.*`` Llama layers, layer 0 without input_layernorm.
A copy of the target's embedding in the checkpoint is checked against the target and dropped
(draftheads always reads the target's own). Variants draftheads' heads cannot compute (RoPE
scaling, ...) are refused by name, never approximated.
"""
from __future__ import annotations

import re

import torch

from ...export.eagle_layers import draftheads_layer_tensors
from ...export.sources import Source, load_strict
from ...heads import HeadsConfig, TargetInfo
from .heads import EagleHead


def strip_model_prefix(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SGLang loads names with or without a ``model.`` prefix; so does this."""
    return {(k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}


def draft_layer_geometry(layer_cfg: dict, hidden: int, where: str) -> dict:
    heads = int(layer_cfg.get("num_attention_heads") or 0)
    if not heads:
        raise ValueError(f"{where}: config.json has no num_attention_heads (needed to split the draft layer's attention)")
    rope = layer_cfg.get("rope_parameters") or {}
    scaling = layer_cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling:
        raise ValueError(f"{where}: RoPE scaling {scaling} in the draft layer: draftheads' draft layer applies plain RoPE")
    theta = layer_cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0
    if not layer_cfg.get("intermediate_size"):
        raise ValueError(
            f"{where}: config.json has no intermediate_size (the draft layer's MLP width, needed to build it); "
            "add the value the checkpoint was trained with (the first dimension of mlp.gate_proj.weight)"
        )
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": int(layer_cfg.get("num_key_value_heads") or heads),
        "head_dim": int(layer_cfg.get("head_dim") or hidden // heads),
        "intermediate_size": int(layer_cfg["intermediate_size"]),
        "rope_theta": float(theta),
        "rms_norm_eps": float(layer_cfg.get("rms_norm_eps", 1e-6)),
    }


def check_embedding(tensors: dict[str, torch.Tensor], target: torch.nn.Module, where: str) -> None:
    emb = tensors.pop("embed_tokens.weight", None)
    if emb is None:
        return
    ref = target.get_input_embeddings().weight.detach().float().cpu()
    if tuple(emb.shape) != tuple(ref.shape) or not torch.allclose(emb.float(), ref, rtol=1e-2, atol=1e-3):
        raise ValueError(
            f"{where}: embed_tokens.weight differs from the target's embedding (another model, or trained): "
            "draftheads' EAGLE heads read the target's own embedding"
        )


def refuse_leftovers(tensors: dict[str, torch.Tensor], where: str, kind: str) -> None:
    if tensors:
        raise ValueError(f"{where}: tensors with no place in draftheads' {kind} head: {', '.join(sorted(tensors)[:8])}")


def draft_layer_widths(source: Source) -> tuple[int, int] | None:
    """(fc's output width, the first layer's attention input width) of an EAGLE-style checkpoint
    (``fc.weight`` and ``layers.0.self_attn.*``), None for another: EAGLE-3's first layer attends
    over [embedding, fused] (2H), EAGLE-1's over the fused state (H)."""
    bare = {k[len("model."):] if k.startswith("model.") else k for k in source.tensors}
    fc = next((source.tensors[k] for k in source.tensors if re.fullmatch(r"(model\.)?fc\.weight", k)), None)
    if fc is None or not any(k.startswith("layers.0.self_attn.") for k in bare):
        return None
    q = next((source.tensors[k] for k in source.tensors if k.endswith("layers.0.self_attn.q_proj.weight")), None)
    return None if q is None else (int(fc.shape[0]), int(q.shape[1]))


def read_eagle(source: Source, target: torch.nn.Module) -> EagleHead:
    where = source.describe()
    tensors = strip_model_prefix(source.tensors)
    tensors.pop("lm_head.weight", None) if _same_as_target_head(tensors, target) else None
    check_embedding(tensors, target, where)
    info = TargetInfo.from_model(target)
    cfg = source.config
    d = info.hidden_size
    if int(cfg.get("hidden_size", d)) != d:
        raise ValueError(f"{where}: the draft's hidden_size {cfg.get('hidden_size')} is not the target's {d}")
    num_layers = len({k.split(".")[1] for k in tensors if k.startswith("layers.")})
    if num_layers == 0 or "fc.weight" not in tensors:
        raise ValueError(f"{where}: an EAGLE draft needs fc.weight and layers.0.* tensors")
    fc_bias = "fc.bias" in tensors
    extra = {**draft_layer_geometry(cfg, d, where), "fc_bias": fc_bias}
    config = HeadsConfig(head_type="eagle", num_heads=1, num_layers=num_layers, hidden_size=d,
                         vocab_size=info.vocab_size, lm_head="shared", target=info, extra=extra)
    head = EagleHead(config)
    state = draftheads_layer_tensors(tensors, num_layers, [f"layers.{i}" for i in range(num_layers)])
    state["fc.weight"] = tensors.pop("fc.weight")
    if fc_bias:
        state["fc.bias"] = tensors.pop("fc.bias")
    refuse_leftovers(tensors, where, "EAGLE")
    state["token_counts"] = torch.zeros(info.vocab_size, dtype=torch.long)
    return load_strict(head, state, where)


def _same_as_target_head(tensors: dict[str, torch.Tensor], target: torch.nn.Module) -> bool:
    w = tensors.get("lm_head.weight")
    if w is None:
        return False
    ref = target.get_output_embeddings().weight.detach().float().cpu()
    if tuple(w.shape) == tuple(ref.shape) and torch.allclose(w.float(), ref, rtol=1e-2, atol=1e-3):
        return True
    raise ValueError("lm_head.weight in an EAGLE-1 checkpoint differs from the target's LM head: draftheads' EAGLE "
                     "head scores with the target's own")
