"""DSpark checkpoints -> draftheads dspark heads: vLLM's dense ``Qwen3DSparkModel`` layout (what
DeepSpec writes, deepseek-ai/dspark_qwen3_8b_block7) and speculators ``dspark``.

Both hold DFlash's Qwen3 layers, ``fc``, ``hidden_norm``, ``norm`` (methods/dflash/imports.py
reads those), plus ``markov_head.markov_w1`` [V, r], ``markov_head.markov_w2`` [Vd, r] and
optionally ``confidence_head.proj`` (weight and bias). They differ in the config:
- native (vLLM's Qwen3 DSpark): a Qwen3 config, ``architectures: ["Qwen3DSparkModel"]``,
  top-level ``target_layer_ids`` (layer outputs, feature f-1; a legacy ``dflash_config`` is read
  too), ``mask_token_id``, ``block_size``, ``sample_from_anchor`` (vLLM's default there: true);
- speculators: ``speculators_model_type: "dspark"``, ``aux_hidden_state_layer_ids`` (= features),
  the geometry under ``transformer_layer_config``, ``sample_from_anchor`` defaulting to false (as
  vLLM's speculators mapping reads it), frozen copies of the target's embedding and LM head.

Refused by name (draftheads would decode them otherwise than the engine): Markov heads other than
"vanilla" (speculators also trains "gated" and "rnn"; vLLM 0.32 runs vanilla only), a Markov rank
of 0 or above the vocabulary, what DFlash's reader refuses (sliding-window or causal layers, a
mask embedding, an embedding or LM head other than the target's). A reduced draft vocabulary
(``d2t`` + ``lm_head.weight`` rows + ``markov_w2`` rows) imports with the other rows of the Markov
projection at zero: the heads draft only from those ids (its chain saved in tree.json).
"""
from __future__ import annotations

import torch

from ...export.sources import Source
from ...heads.config import TargetInfo
from ..dflash.heads import check_dflash_feature_layers
from ..dflash.imports import _layer_config, _refuse_causal_or_sliding, block_tensors, build_block_heads
from .heads import MARKOV_HEAD_TYPES, DSparkHeads, check_markov_rank

NATIVE, SPECULATORS = "dspark", "speculators-dspark"


def is_native(source: Source) -> bool:
    return "Qwen3DSparkModel" in (source.config.get("architectures") or [])


def _feature_layers(source: Source, layout: str, n_target: int) -> list[int]:
    cfg, where = source.config, source.describe()
    if layout == SPECULATORS:
        ids = cfg.get("aux_hidden_state_layer_ids")
        layers = [int(i) for i in ids or []]
    else:
        ids = cfg.get("target_layer_ids") or (cfg.get("dflash_config") or {}).get("target_layer_ids")
        layers = [int(i) + 1 for i in ids or []]  # layer outputs; draftheads numbers the input of the next layer
    if not layers:
        raise ValueError(f"{where}: the config names no target layers (target_layer_ids / aux_hidden_state_layer_ids)")
    check_dflash_feature_layers(layers, n_target)
    return layers


def _mask_token(source: Source) -> int:
    cfg = source.config
    for value in (cfg.get("mask_token_id"), (cfg.get("dflash_config") or {}).get("mask_token_id"), cfg.get("dspark_noise_token_id")):
        if value is not None:
            return int(value)
    raise ValueError(f"{source.describe()}: no mask_token_id in the config (the id the block's mask slots carry)")


def read_dspark(source: Source, target: torch.nn.Module, layout: str) -> DSparkHeads:
    cfg, where = source.config, source.describe()
    kind = cfg.get("markov_head_type", "vanilla")
    if kind not in MARKOV_HEAD_TYPES:
        raise ValueError(f"{where}: markov_head_type {kind!r}: draftheads (and vLLM 0.32) run {', '.join(MARKOV_HEAD_TYPES)} "
                         "Markov heads only")
    tensors, vocab_ids = block_tensors(source, target)
    biases = [k for k in tensors if k.endswith(".bias") and k != "confidence_head.proj.bias"]
    if biases:
        raise ValueError(f"{where}: biases ({biases[0]}): draftheads' DSpark layers have none")
    info = TargetInfo.from_model(target)
    w1 = tensors.get("markov_head.markov_w1.weight")
    if w1 is None:
        raise ValueError(f"{where}: no markov_head.markov_w1.weight (a DSpark draft without its Markov head)")
    rank = check_markov_rank(cfg["markov_rank"] if "markov_rank" in cfg else int(w1.shape[1]), info.vocab_size)
    if rank != w1.shape[1]:
        raise ValueError(f"{where}: markov_rank {rank} in the config, but markov_w1 is {tuple(w1.shape)}")
    w2 = tensors.get("markov_head.markov_w2.weight")
    if vocab_ids is not None and w2 is not None and w2.shape[0] == vocab_ids.numel() < info.vocab_size:
        full = w2.new_zeros(info.vocab_size, w2.shape[1])
        full[vocab_ids] = w2  # the other ids are never drafted: the heads keep to the draft vocabulary
        tensors["markov_head.markov_w2.weight"] = full
    confidence = bool(cfg.get("enable_confidence_head", "confidence_head.proj.weight" in tensors))
    if not confidence:
        tensors = {k: v for k, v in tensors.items() if not k.startswith("confidence_head.")}
    with_markov = bool(cfg.get("confidence_head_with_markov", False)) and confidence
    default_anchor = layout == NATIVE  # vLLM: getattr(hf_config, "sample_from_anchor", True) natively, False via speculators
    family = {"markov_rank": rank, "markov_head_type": "vanilla", "confidence_head": confidence,
              "confidence_with_markov": with_markov, "confidence_alpha": 1.0,
              "sample_from_anchor": bool(cfg.get("sample_from_anchor", default_anchor))}
    layer_cfg = _layer_config(source, "speculators-dflash" if layout == SPECULATORS else "dflash")
    _refuse_causal_or_sliding(source, "speculators-dflash" if layout == SPECULATORS else "dflash", layer_cfg)
    layers = _feature_layers(source, layout, info.num_hidden_layers)
    block = int(cfg.get("block_size") or cfg.get("dspark_block_size") or 0)
    if block < 1:
        raise ValueError(f"{where}: no block_size in the config")
    return build_block_heads(source, target, tensors, layer_cfg, layers, block, _mask_token(source), DSparkHeads, family,
                             vocab_ids)
