"""EAGLE-1/2 and EAGLE-3 checkpoints -> draftheads EagleHead / Eagle3Head.

EAGLE-1/2 (SafeAILab ``cnets.py``; also vLLM's and SGLang's EAGLE-1 folders): ``fc`` over
cat(embedding, feature) (+ bias), ``layers.{i}.*`` Llama layers, layer 0 without input_layernorm.
EAGLE-3: ``midlayer.*`` (SafeAILab, SpecForge, SGLang; explicit aux ids in SGLang's numbering,
"output of layer j") or ``layers.0.*`` (speculators, vLLM's numbering "input of layer k"), with
``d2t`` offsets and an optional ``t2d`` mask. A copy of the target's embedding in the checkpoint is
checked against the target and dropped (draftheads always reads the target's own).
P-EAGLE (speculators ``peagle``): the EAGLE-3 layout plus ``mask_hidden``, a top-level
``mask_token_id`` and the draft's own trained ``embed_tokens`` (kept; without one, vLLM embeds
with the target's table, so that is what the imported heads get).
EAGLE 3.1 (config ``fc_norm`` with ``fc_norm.{j}.weight`` per captured layer, ``norm_output``) imports
into an EAGLE-3 head with the same options (heads/eagle.py says what vLLM computes for them); a
P-EAGLE checkpoint setting them is refused (vLLM's P-EAGLE mapping does not forward them).
``norm_before_fc`` (with ``input_norm.weight`` [n*H], one RMSNorm over the whole fc input) imports
the same way, into EAGLE-3 and P-EAGLE heads alike: vLLM's P-EAGLE mapping forwards it, and vLLM
puts ``mask_hidden`` through the same norm before fc, as draftheads' P-EAGLE head does (heads/peagle.py,
``mask_input``). The speculators trainer's defaults set ``norm_before_fc`` and ``norm_output`` (a
P-EAGLE checkpoint with ``norm_output`` stays refused).
Variants draftheads' heads cannot compute (norm_before_residual, use_aux_norm, RoPE scaling, ...)
are refused by name, never approximated.
"""
from __future__ import annotations

import re

import torch

from ..heads import Eagle3Head, EagleHead, HeadsConfig, PEagleHead, TargetInfo
from ..heads.config import text_config
from ..heads.eagle import check_feature_layers
from .eagle_layers import draftheads_layer_tensors
from .import_medusa import load_strict
from .layouts import d2t_absolute, default_engine_feature_layers, feature_layers_from_sglang, feature_layers_from_vllm
from .sources import Source

UNSUPPORTED_FLAGS = ("norm_before_residual", "use_aux_norm")
# computed by Eagle3Head; P-EAGLE computes norm_before_fc only (vLLM does not forward fc_norm / norm_output for it)
EAGLE31_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")
PEAGLE_REFUSED = ("fc_norm", "norm_output")


def _strip_model_prefix(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """SGLang loads names with or without a ``model.`` prefix; so does this."""
    return {(k[len("model."):] if k.startswith("model.") else k): v for k, v in tensors.items()}


def _geometry(layer_cfg: dict, hidden: int, where: str) -> dict:
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


def _check_embedding(tensors: dict[str, torch.Tensor], target: torch.nn.Module, where: str) -> None:
    emb = tensors.pop("embed_tokens.weight", None)
    if emb is None:
        return
    ref = target.get_input_embeddings().weight.detach().float().cpu()
    if tuple(emb.shape) != tuple(ref.shape) or not torch.allclose(emb.float(), ref, rtol=1e-2, atol=1e-3):
        raise ValueError(
            f"{where}: embed_tokens.weight differs from the target's embedding (another model, or trained): "
            "draftheads' EAGLE heads read the target's own embedding"
        )


def _leftovers(tensors: dict[str, torch.Tensor], where: str, kind: str) -> None:
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
    tensors = _strip_model_prefix(source.tensors)
    tensors.pop("lm_head.weight", None) if _same_as_target_head(tensors, target) else None
    _check_embedding(tensors, target, where)
    info = TargetInfo.from_model(target)
    cfg = source.config
    d = info.hidden_size
    if int(cfg.get("hidden_size", d)) != d:
        raise ValueError(f"{where}: the draft's hidden_size {cfg.get('hidden_size')} is not the target's {d}")
    num_layers = len({k.split(".")[1] for k in tensors if k.startswith("layers.")})
    if num_layers == 0 or "fc.weight" not in tensors:
        raise ValueError(f"{where}: an EAGLE draft needs fc.weight and layers.0.* tensors")
    fc_bias = "fc.bias" in tensors
    extra = {**_geometry(cfg, d, where), "fc_bias": fc_bias}
    config = HeadsConfig(head_type="eagle", num_heads=1, num_layers=num_layers, hidden_size=d,
                         vocab_size=info.vocab_size, lm_head="shared", target=info, extra=extra)
    head = EagleHead(config)
    state = draftheads_layer_tensors(tensors, num_layers, [f"layers.{i}" for i in range(num_layers)])
    state["fc.weight"] = tensors.pop("fc.weight")
    if fc_bias:
        state["fc.bias"] = tensors.pop("fc.bias")
    _leftovers(tensors, where, "EAGLE")
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


def read_eagle3(source: Source, target: torch.nn.Module, layout: str, peagle: bool = False) -> Eagle3Head:
    """``layout``: "eagle3" (midlayer.*, SGLang aux-id numbering) or "speculators" (layers.0.*, vLLM's);
    ``peagle``: a speculators P-EAGLE checkpoint (the P-EAGLE method's layout), read as P-EAGLE heads."""
    where = source.describe()
    tensors = _strip_model_prefix(source.tensors)
    if peagle:
        peagle_state = _peagle_tensors(tensors, source.config, target, where)
    else:
        _check_embedding(tensors, target, where)
    info = TargetInfo.from_model(target)
    n_target = int(text_config(target).num_hidden_layers)
    d = info.hidden_size
    cfg = source.config
    if layout == "speculators":
        layer_cfg = dict(cfg.get("transformer_layer_config") or {})
        # vLLM's default for this format (its P-EAGLE mapping defaults to false)
        flags = {"norm_before_residual": cfg.get("norm_before_residual", not peagle)}
        flags.update({k: cfg.get(k, False) for k in UNSUPPORTED_FLAGS + EAGLE31_FLAGS if k != "norm_before_residual"})
        inner = layer_cfg.get("eagle_config") or {}
        if "norm_before_fc" in inner:  # vLLM's llama_eagle3 reads eagle_config's before the top-level key
            flags["norm_before_fc"] = inner["norm_before_fc"]
        ids = cfg.get("eagle_aux_hidden_state_layer_ids") or inner.get("eagle_aux_hidden_state_layer_ids")
        feature_layers = feature_layers_from_vllm(ids) if ids else default_engine_feature_layers(n_target)
        prefix0 = "layers.0"
    else:
        layer_cfg = cfg
        eagle_cfg = cfg.get("eagle_config") or {}
        flags = {k: cfg.get(k, eagle_cfg.get(k, False)) for k in UNSUPPORTED_FLAGS + EAGLE31_FLAGS}
        if "norm_before_fc" in eagle_cfg:  # vLLM's llama_eagle3 reads eagle_config's before the top-level key
            flags["norm_before_fc"] = eagle_cfg["norm_before_fc"]
        ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
        feature_layers = feature_layers_from_sglang(ids) if ids else default_engine_feature_layers(n_target)
        prefix0 = "midlayer" if any(k.startswith("midlayer.") for k in tensors) else "layers.0"
    eagle31 = {k: bool(flags.pop(k)) for k in EAGLE31_FLAGS}
    if peagle and any(eagle31[k] for k in PEAGLE_REFUSED):
        raise ValueError(f"{where}: {', '.join(k for k in PEAGLE_REFUSED if eagle31[k])} set on a P-EAGLE checkpoint: "
                         "vLLM's P-EAGLE mapping does not forward fc_norm / norm_output (it serves the draft without), "
                         "and draftheads' P-EAGLE head computes neither")
    on = sorted(k for k, v in flags.items() if v)
    if on:
        raise ValueError(f"{where}: {', '.join(on)} set: draftheads' EAGLE-3 head computes none of these variants "
                         "(it normalises the fused state only on the attention input, after the residual split)")
    check_feature_layers(feature_layers, n_target)
    if len(set(feature_layers)) != len(feature_layers):
        raise ValueError(f"{where}: aux layers {feature_layers} repeat a layer (the engines' defaults 2, L/2, L-3 collide "
                         f"on a {n_target}-layer target): name the layers in config.json")
    for key in ("hidden_size", "target_hidden_size"):
        value = cfg.get(key, layer_cfg.get(key))
        if value is not None and int(value) != d:
            raise ValueError(f"{where}: {key} {value} differs from the target's hidden size {d} (draftheads' EAGLE-3 "
                             "draft layer has the target's width)")
    if "lm_head.weight" not in tensors:
        raise ValueError(f"{where}: an EAGLE-3 draft needs its own lm_head.weight")
    lm_head = tensors.pop("lm_head.weight")
    n_vocab = lm_head.shape[0]
    offsets, mask = tensors.pop("d2t", None), tensors.pop("t2d", None)
    if offsets is None:
        if n_vocab != info.vocab_size:
            raise ValueError(f"{where}: no d2t: a draft vocabulary of {n_vocab} < {info.vocab_size} tokens needs d2t to "
                             "say which target ids it holds (refusing to guess ids 0..N-1)")
        absolute = torch.arange(n_vocab)
    else:
        if offsets.numel() != n_vocab:
            raise ValueError(f"{where}: d2t has {offsets.numel()} entries, lm_head {n_vocab} rows")
        absolute = d2t_absolute(offsets)
    if bool((absolute < 0).any()) or bool((absolute >= info.vocab_size).any()) or absolute.unique().numel() != n_vocab:
        raise ValueError(f"{where}: d2t (offsets: target id = i + d2t[i]) gives ids outside 0..{info.vocab_size - 1} "
                         "or repeats one")
    if mask is not None:
        expected = torch.zeros(info.vocab_size, dtype=torch.bool)
        expected[absolute] = True
        if tuple(mask.shape) != (info.vocab_size,) or not torch.equal(mask.bool(), expected):
            raise ValueError(f"{where}: t2d is not the mask of the target ids d2t names")
    order = torch.argsort(absolute)  # draftheads keeps the draft vocabulary sorted by target id
    num_layers = 1 + len({k.split(".")[1] for k in tensors if k.startswith("layers.") and k.split(".")[1] != "0"})
    extra = {**_geometry(layer_cfg, d, where), "feature_layers": feature_layers, "draft_vocab_size": int(n_vocab)}
    if any(eagle31.values()):  # only when set: plain EAGLE-3 imports stay as they were
        extra.update({k: v for k, v in eagle31.items() if not (peagle and k in PEAGLE_REFUSED)})
    num_heads, cls = 1, Eagle3Head
    if peagle:
        num_heads, cls = peagle_state.pop("num_heads"), PEagleHead
        extra.update(mask_token_id=peagle_state.pop("mask_token_id"), cod_ratio=0.7, cod_min_ratio=0.2)
    config = HeadsConfig(head_type=cls.head_type, num_heads=num_heads, num_layers=num_layers, hidden_size=d,
                         vocab_size=info.vocab_size, lm_head="own", target=info, extra=extra)
    head = cls(config)
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
        missing = [f"fc_norm.{j}.weight" for j in range(len(feature_layers)) if f"fc_norm.{j}.weight" not in tensors]
        if missing:
            raise ValueError(f"{where}: fc_norm set but {', '.join(missing)} missing (one norm per captured layer)")
        for j in range(len(feature_layers)):
            state[f"fc_norm.{j}.weight"] = tensors.pop(f"fc_norm.{j}.weight")
    if eagle31["norm_before_fc"]:  # its entries follow the engine's fc input = draftheads' order here (sorted layers)
        if "input_norm.weight" not in tensors:
            raise ValueError(f"{where}: norm_before_fc set but input_norm.weight missing (vLLM's RMSNorm over the "
                             "whole fc input)")
        state["input_norm.weight"] = tensors.pop("input_norm.weight")
    bias = tensors.pop("fc.bias", None)
    if bias is not None and bool((bias != 0).any()):
        raise ValueError(f"{where}: fc.bias: draftheads' EAGLE-3 fc has no bias")
    _leftovers(tensors, where, "EAGLE-3")
    state["lm_head.weight"] = lm_head[order]
    state["draft_to_target"] = absolute[order]
    tt = torch.full((info.vocab_size,), -1, dtype=torch.long)
    tt[absolute[order]] = torch.arange(n_vocab)
    state["target_to_draft"] = tt
    state["token_counts"] = torch.zeros(info.vocab_size, dtype=torch.long)
    if peagle:
        state.update(peagle_state)
    head = load_strict(head, state, where)
    head.check_vocab_mapping()
    return head


def _peagle_tensors(tensors: dict[str, torch.Tensor], cfg: dict, target: torch.nn.Module, where: str) -> dict:
    """Pop what P-EAGLE adds to EAGLE-3: its embedding, mask_hidden; read the mask id and depths."""
    mask_hidden = tensors.pop("mask_hidden", None)
    if mask_hidden is None:
        raise ValueError(f"{where}: a speculators peagle checkpoint needs mask_hidden (vLLM refuses one without it)")
    mask_id = cfg.get("mask_token_id", cfg.get("pard_token", cfg.get("ptd_token_id")))
    vocab = int(target.get_output_embeddings().weight.shape[0])
    if isinstance(mask_id, bool) or not isinstance(mask_id, int) or not 0 <= mask_id < vocab:
        raise ValueError(f"{where}: mask_token_id {mask_id!r} is missing or outside the target's vocabulary 0..{vocab - 1}")
    methods = (cfg.get("speculators_config") or {}).get("proposal_methods") or [{}]
    depths = methods[0].get("speculative_tokens")
    if isinstance(depths, bool) or not isinstance(depths, int) or depths < 1:
        raise ValueError(f"{where}: speculators_config.proposal_methods[0].speculative_tokens {depths!r} is not a "
                         "positive integer (the draft positions the checkpoint was made for)")
    embedding = tensors.pop("embed_tokens.weight", None)
    if embedding is None:  # vLLM shares the target's embedding then: so do the imported heads
        embedding = target.get_input_embeddings().weight.detach().cpu()
    return {"embed_tokens.weight": embedding, "mask_hidden": mask_hidden.reshape(1, 1, -1),
            "mask_token_id": int(mask_id), "num_heads": int(depths)}
