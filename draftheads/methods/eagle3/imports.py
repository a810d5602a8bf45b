"""EAGLE-3 checkpoints -> draftheads Eagle3Head (and, through a `Eagle3Reading` variant, heads that
extend EAGLE-3's layout: P-EAGLE's, methods/peagle/imports.py).

EAGLE-3: ``midlayer.*`` (SafeAILab, SpecForge, SGLang; explicit aux ids in SGLang's numbering,
"output of layer j") or ``layers.0.*`` (speculators, vLLM's numbering "input of layer k"), with
``d2t`` offsets and an optional ``t2d`` mask. A copy of the target's embedding in the checkpoint is
checked against the target and dropped (draftheads always reads the target's own).
EAGLE 3.1 (config ``fc_norm`` with ``fc_norm.{j}.weight`` per captured layer, ``norm_output``) imports
into an EAGLE-3 head with the same options (methods/eagle3/heads.py says what vLLM computes for them).
``norm_before_fc`` (with ``input_norm.weight`` [n*H], one RMSNorm over the whole fc input) imports
the same way. The speculators trainer's defaults set ``norm_before_fc`` and ``norm_output``.
Variants draftheads' heads cannot compute (norm_before_residual, use_aux_norm, RoPE scaling, ...)
are refused by name, never approximated.
"""
from __future__ import annotations

from typing import Any

import torch

from ...export.eagle_layers import draftheads_layer_tensors
from ...export.layouts import d2t_absolute, default_engine_feature_layers, feature_layers_from_sglang, feature_layers_from_vllm
from ...export.sources import Source, load_strict
from ...heads import HeadsConfig, TargetInfo
from ...heads.config import text_config
from .heads import Eagle3Head, check_feature_layers
from ..eagle.imports import check_embedding, draft_layer_geometry, refuse_leftovers, strip_model_prefix

UNSUPPORTED_FLAGS = ("norm_before_residual", "use_aux_norm")
EAGLE31_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")  # computed by Eagle3Head


class Eagle3Reading:
    """How an EAGLE-3-layout checkpoint becomes heads: plain EAGLE-3 here. A variant of the layout
    (more tensors, a config key, another heads class) subclasses it and overrides what differs."""

    heads: type = Eagle3Head
    title = "EAGLE-3"
    #: vLLM's default of ``norm_before_residual`` for the speculators format, for this variant.
    norm_before_residual = True
    #: EAGLE 3.1 options set in a checkpoint that this variant refuses (it would serve another draft).
    refused: tuple[str, ...] = ()

    def take(self, tensors: dict[str, torch.Tensor], cfg: dict, target: torch.nn.Module, where: str) -> dict[str, Any]:
        """Pop the variant's own tensors and read its own keys: ``{"tensors": {name: tensor}, "num_heads":
        int, "extra": {...}}`` go into the heads. EAGLE-3: a copy of the target's embedding is checked and
        dropped; one draft step."""
        check_embedding(tensors, target, where)
        return {"tensors": {}, "num_heads": 1, "extra": {}}

    def refuse(self, eagle31: dict[str, bool], where: str) -> None:
        """Refuse EAGLE 3.1 options this variant cannot compute."""
        on = [k for k in self.refused if eagle31[k]]
        if on:
            raise ValueError(f"{where}: {', '.join(on)} set on a {self.title} checkpoint: vLLM's {self.title} mapping "
                             f"does not forward {' / '.join(self.refused)} (it serves the draft without), and "
                             f"draftheads' {self.title} head computes neither")


def read_eagle3(source: Source, target: torch.nn.Module, layout: str, reading: Eagle3Reading | None = None):
    """``layout``: "eagle3" (midlayer.*, SGLang aux-id numbering) or "speculators" (layers.0.*, vLLM's);
    ``reading``: the variant of the layout (default: plain EAGLE-3)."""
    reading = reading or Eagle3Reading()
    where = source.describe()
    tensors = strip_model_prefix(source.tensors)
    taken = reading.take(tensors, source.config, target, where)
    info = TargetInfo.from_model(target)
    n_target = int(text_config(target).num_hidden_layers)
    flags, feature_layers, layer_cfg, prefix0 = _layout_settings(source.config, tensors, layout, reading, n_target)
    eagle31 = {k: bool(flags.pop(k)) for k in EAGLE31_FLAGS}
    reading.refuse(eagle31, where)
    on = sorted(k for k, v in flags.items() if v)
    if on:
        raise ValueError(f"{where}: {', '.join(on)} set: draftheads' EAGLE-3 head computes none of these variants "
                         "(it normalises the fused state only on the attention input, after the residual split)")
    _check_sizes(source.config, layer_cfg, feature_layers, n_target, info.hidden_size, where)
    if "lm_head.weight" not in tensors:
        raise ValueError(f"{where}: an EAGLE-3 draft needs its own lm_head.weight")
    lm_head = tensors.pop("lm_head.weight")
    absolute = _draft_vocabulary(tensors, lm_head.shape[0], info.vocab_size, where)
    num_layers = 1 + len({k.split(".")[1] for k in tensors if k.startswith("layers.") and k.split(".")[1] != "0"})
    extra = {**draft_layer_geometry(layer_cfg, info.hidden_size, where), "feature_layers": feature_layers,
             "draft_vocab_size": int(lm_head.shape[0])}
    if any(eagle31.values()):  # only when set: plain EAGLE-3 imports stay as they were
        extra.update({k: v for k, v in eagle31.items() if k not in reading.refused})
    extra.update(taken["extra"])
    config = HeadsConfig(head_type=reading.heads.head_type, num_heads=taken["num_heads"], num_layers=num_layers,
                         hidden_size=info.hidden_size, vocab_size=info.vocab_size, lm_head="own", target=info, extra=extra)
    state = _layer_state(tensors, num_layers, prefix0, eagle31, len(feature_layers), where)
    order = torch.argsort(absolute)  # draftheads keeps the draft vocabulary sorted by target id
    state["lm_head.weight"] = lm_head[order]
    state["draft_to_target"] = absolute[order]
    tt = torch.full((info.vocab_size,), -1, dtype=torch.long)
    tt[absolute[order]] = torch.arange(lm_head.shape[0])
    state["target_to_draft"] = tt
    state["token_counts"] = torch.zeros(info.vocab_size, dtype=torch.long)
    state.update(taken["tensors"])
    head = load_strict(reading.heads(config), state, where)
    head.check_vocab_mapping()
    return head


def _layout_settings(cfg: dict, tensors: dict, layout: str, reading: Eagle3Reading, n_target: int):
    """(the variant flags set, feature layers, the draft layer's config, layer 0's prefix) as the layout says."""
    if layout == "speculators":
        layer_cfg = dict(cfg.get("transformer_layer_config") or {})
        flags = {"norm_before_residual": cfg.get("norm_before_residual", reading.norm_before_residual)}
        flags.update({k: cfg.get(k, False) for k in UNSUPPORTED_FLAGS + EAGLE31_FLAGS if k != "norm_before_residual"})
        inner = layer_cfg.get("eagle_config") or {}
        if "norm_before_fc" in inner:  # vLLM's llama_eagle3 reads eagle_config's before the top-level key
            flags["norm_before_fc"] = inner["norm_before_fc"]
        ids = cfg.get("eagle_aux_hidden_state_layer_ids") or inner.get("eagle_aux_hidden_state_layer_ids")
        return flags, feature_layers_from_vllm(ids) if ids else default_engine_feature_layers(n_target), layer_cfg, "layers.0"
    eagle_cfg = cfg.get("eagle_config") or {}
    flags = {k: cfg.get(k, eagle_cfg.get(k, False)) for k in UNSUPPORTED_FLAGS + EAGLE31_FLAGS}
    if "norm_before_fc" in eagle_cfg:  # vLLM's llama_eagle3 reads eagle_config's before the top-level key
        flags["norm_before_fc"] = eagle_cfg["norm_before_fc"]
    ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
    feature_layers = feature_layers_from_sglang(ids) if ids else default_engine_feature_layers(n_target)
    return flags, feature_layers, cfg, "midlayer" if any(k.startswith("midlayer.") for k in tensors) else "layers.0"


def _check_sizes(cfg: dict, layer_cfg: dict, feature_layers: list[int], n_target: int, d: int, where: str) -> None:
    check_feature_layers(feature_layers, n_target)
    if len(set(feature_layers)) != len(feature_layers):
        raise ValueError(f"{where}: aux layers {feature_layers} repeat a layer (the engines' defaults 2, L/2, L-3 collide "
                         f"on a {n_target}-layer target): name the layers in config.json")
    for key in ("hidden_size", "target_hidden_size"):
        value = cfg.get(key, layer_cfg.get(key))
        if value is not None and int(value) != d:
            raise ValueError(f"{where}: {key} {value} differs from the target's hidden size {d} (draftheads' EAGLE-3 "
                             "draft layer has the target's width)")


def _draft_vocabulary(tensors: dict, n_vocab: int, vocab_size: int, where: str) -> torch.Tensor:
    """The target id of each draft-vocabulary row, from ``d2t`` (offsets) and checked against ``t2d``."""
    offsets, mask = tensors.pop("d2t", None), tensors.pop("t2d", None)
    if offsets is None:
        if n_vocab != vocab_size:
            raise ValueError(f"{where}: no d2t: a draft vocabulary of {n_vocab} < {vocab_size} tokens needs d2t to "
                             "say which target ids it holds (refusing to guess ids 0..N-1)")
        absolute = torch.arange(n_vocab)
    else:
        if offsets.numel() != n_vocab:
            raise ValueError(f"{where}: d2t has {offsets.numel()} entries, lm_head {n_vocab} rows")
        absolute = d2t_absolute(offsets)
    if bool((absolute < 0).any()) or bool((absolute >= vocab_size).any()) or absolute.unique().numel() != n_vocab:
        raise ValueError(f"{where}: d2t (offsets: target id = i + d2t[i]) gives ids outside 0..{vocab_size - 1} "
                         "or repeats one")
    if mask is not None:
        expected = torch.zeros(vocab_size, dtype=torch.bool)
        expected[absolute] = True
        if tuple(mask.shape) != (vocab_size,) or not torch.equal(mask.bool(), expected):
            raise ValueError(f"{where}: t2d is not the mask of the target ids d2t names")
    return absolute


def _layer_state(tensors: dict, num_layers: int, prefix0: str, eagle31: dict[str, bool], n_features: int,
                 where: str) -> dict[str, torch.Tensor]:
    """The draft layers' tensors under draftheads' names (fc, norms, EAGLE 3.1's), every one used."""
    later_norm = "hidden_norm" if any(k.startswith("layers.1.hidden_norm") for k in tensors) else "input_layernorm"
    prefixes = [prefix0] + [f"layers.{i}" for i in range(1, num_layers)]
    embed_norm = tensors.pop(f"{prefix0}.input_layernorm.weight", None)
    hidden_norm = tensors.pop(f"{prefix0}.hidden_norm.weight", None)
    state = draftheads_layer_tensors(tensors, num_layers, prefixes, later_norm)
    for name, value in (("embed_norm.weight", embed_norm), ("hidden_norm.weight", hidden_norm)):
        if value is not None:
            state[name] = value
    for name in ("fc.weight", "norm.weight"):
        if name in tensors:
            state[name] = tensors.pop(name)
    if eagle31["fc_norm"]:  # chunk j of the engine's fc input = the j-th captured layer = feature_layers[j] (sorted)
        missing = [f"fc_norm.{j}.weight" for j in range(n_features) if f"fc_norm.{j}.weight" not in tensors]
        if missing:
            raise ValueError(f"{where}: fc_norm set but {', '.join(missing)} missing (one norm per captured layer)")
        for j in range(n_features):
            state[f"fc_norm.{j}.weight"] = tensors.pop(f"fc_norm.{j}.weight")
    if eagle31["norm_before_fc"]:  # its entries follow the engine's fc input = draftheads' order here (sorted layers)
        if "input_norm.weight" not in tensors:
            raise ValueError(f"{where}: norm_before_fc set but input_norm.weight missing (vLLM's RMSNorm over the "
                             "whole fc input)")
        state["input_norm.weight"] = tensors.pop("input_norm.weight")
    bias = tensors.pop("fc.bias", None)
    if bias is not None and bool((bias != 0).any()):
        raise ValueError(f"{where}: fc.bias: draftheads' EAGLE-3 fc has no bias")
    refuse_leftovers(tensors, where, "EAGLE-3")
    return state
