"""DFlash2 checkpoints -> draftheads dflash2 heads: the z-lab layout (``DFlash2DraftModel``, what
SpecForge PR #772 and vLLM read) and speculators ``dflash2``.

DFlash's tensors and config keys (methods/dflash/imports.py reads them) plus, per layer,
``attention_conv`` / ``mlp_conv`` (``base_kernel``, ``kernel_projection.weight``) and the
``candidate_selector`` (two codebooks and ``hidden_projection.weight``). The sizes come from
``dflash_config`` (z-lab; SpecForge may also put them at the top, as speculators does) or the
tensors' shapes. Refused by name, besides what DFlash's reader refuses: a reduced draft vocabulary
(DFlash2's contract is the whole vocabulary) and sizes `check_dflash2_options` refuses.
"""
from __future__ import annotations

import torch

from ...export.sources import Source
from ...heads.config import TargetInfo
from ..dflash.imports import (_feature_layers, _layer_config, _mask_token, _refuse_causal_or_sliding, block_tensors,
                              build_block_heads)
from .heads import DFlash2Heads

NATIVE, SPECULATORS = "dflash2", "speculators-dflash2"
KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
SCALARS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")


def is_native(source: Source) -> bool:
    return "DFlash2DraftModel" in (source.config.get("architectures") or []) and "speculators_model_type" not in source.config


def read_dflash2(source: Source, target: torch.nn.Module, layout: str) -> DFlash2Heads:
    cfg, where = source.config, source.describe()
    dflash_layout = "speculators-dflash" if layout == SPECULATORS else "dflash"
    tensors, vocab_ids = block_tensors(source, target)
    info = TargetInfo.from_model(target)
    if vocab_ids is not None and vocab_ids.numel() < info.vocab_size:
        raise ValueError(f"{where}: a reduced draft vocabulary (d2t): DFlash2 drafts over the target's whole vocabulary "
                         "(its selector's codebooks cover it), as vLLM and speculators require")
    if any(k.endswith(".bias") for k in tensors):
        raise ValueError(f"{where}: biases ({next(k for k in tensors if k.endswith('.bias'))}): draftheads' DFlash2 layers have none")
    nested = cfg.get("dflash_config") or {}
    family = {}
    for key in KEYS:
        value = nested.get(key, cfg.get(key))
        if value is None:
            raise ValueError(f"{where}: no {key} in the config (dflash_config.{key})")
        family[key] = int(value)
    for key in SCALARS:
        value = nested.get(key, cfg.get(key))
        if value is not None:
            family[key] = float(value)
    family["selector_alpha"] = 1.0
    layer_cfg = _layer_config(source, dflash_layout)
    _refuse_causal_or_sliding(source, dflash_layout, layer_cfg)
    layers = _feature_layers(source, dflash_layout, info.num_hidden_layers)
    block = int(cfg.get("block_size") or nested.get("block_size") or 0)
    if block < 2:
        raise ValueError(f"{where}: no block_size >= 2 in the config")
    return build_block_heads(source, target, tensors, layer_cfg, layers, block, _mask_token(source, dflash_layout),
                             DFlash2Heads, family, None)
