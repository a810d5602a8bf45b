"""DFlash checkpoints -> draftheads dflash heads: the z-lab/SpecForge layout and speculators ``dflash``.

Both hold Qwen3 decoder layers with q/k norms, ``fc`` over the aux hidden states in layer order,
``hidden_norm`` and ``norm`` under the names draftheads uses (optionally prefixed ``model.``).
They differ in the config: z-lab/SpecForge write ``dflash_config.target_layer_ids`` (layer
outputs, feature f-1) and ``block_size`` at the top; speculators write ``aux_hidden_state_layer_ids``
(= draftheads' feature ids), ``mask_token_id`` at the top and the layer geometry under
``transformer_layer_config``, plus frozen copies of the target's embedding and LM head.

What draftheads cannot decode exactly is refused by name: sliding-window or causal draft layers
(draftheads drafts with full bidirectional attention in the block), a separate mask embedding
(``mask_embedding.pt``: draftheads embeds the mask with the target's row), biases, and an
embedding or LM head other than the target's.

A reduced draft vocabulary (``lm_head.weight`` [Vd, H] + ``d2t``, what draftheads' vLLM export
writes for a calibrated ``draft_vocab_size``) imports when the LM head is the target's rows at
the d2t ids: the heads then draft from exactly those ids (token counts of 1 on them, 0 elsewhere,
so `DraftHeads.draft_vocab` gives them back) by default, through a chain tree saved with it.
"""
from __future__ import annotations

import torch

from ...export.sources import Source
from ...heads.config import HeadsConfig, TargetInfo
from .heads import DFlashHeads, check_dflash_feature_layers
from ...plans import StaticTree, given_tree

SLIDING = "sliding_attention"


def _layer_config(source: Source, layout: str) -> dict:
    cfg = source.config
    return dict(cfg.get("transformer_layer_config") or {}) if layout == "speculators-dflash" else cfg


def _refuse_causal_or_sliding(source: Source, layout: str, layer_cfg: dict) -> None:
    cfg, where = source.config, source.describe()
    types = layer_cfg.get("layer_types") or cfg.get("layer_types") or []
    dflash = cfg.get("dflash_config") or {}
    if SLIDING in types or dflash.get("use_swa") or layer_cfg.get("use_sliding_window"):
        raise ValueError(
            f"{where}: sliding-window draft layers ({types or 'use_swa'}): draftheads' DFlash layers attend to the whole "
            "context, so it would decode these differently; refused rather than decoded inexactly"
        )
    causal = layer_cfg.get("is_causal", cfg.get("is_causal", dflash.get("causal")))
    if causal:
        raise ValueError(f"{where}: causal draft layers (is_causal / dflash_config.causal true): draftheads drafts the block "
                         "bidirectionally, as DFlash trains it")


def _feature_layers(source: Source, layout: str, n_target: int) -> list[int]:
    cfg, where = source.config, source.describe()
    if layout == "speculators-dflash":
        ids = cfg.get("aux_hidden_state_layer_ids")
        if not ids:
            raise ValueError(f"{where}: speculators dflash config without aux_hidden_state_layer_ids")
        layers = [int(i) for i in ids]
    else:
        ids = (cfg.get("dflash_config") or {}).get("target_layer_ids")
        if not ids:
            raise ValueError(f"{where}: dflash_config.target_layer_ids is missing (which target layers the draft reads)")
        layers = [int(i) + 1 for i in ids]  # z-lab numbers layer outputs; draftheads the input of the next layer
    check_dflash_feature_layers(layers, n_target)
    return layers


def _mask_token(source: Source, layout: str) -> int:
    cfg = source.config
    mask = cfg.get("mask_token_id") if layout == "speculators-dflash" else (cfg.get("dflash_config") or {}).get("mask_token_id")
    if mask is None:
        raise ValueError(f"{source.describe()}: no mask_token_id in the config (the id the block's mask slots carry)")
    return int(mask)


def _check_frozen_copies(tensors: dict[str, torch.Tensor], target: torch.nn.Module, where: str) -> None:
    """Drop shipped copies of the target's embedding / LM head; refuse them if they differ."""
    for name, ref in (("embed_tokens.weight", target.get_input_embeddings().weight),
                      ("lm_head.weight", target.get_output_embeddings().weight)):
        got = tensors.pop(name, None)
        if got is None:
            continue
        ref = ref.detach().float().cpu()
        if tuple(got.shape) != tuple(ref.shape) or not torch.allclose(got.float(), ref, rtol=1e-2, atol=1e-3):
            raise ValueError(f"{where}: {name} differs from the target's: draftheads' DFlash heads use the target's own "
                             "(a trained or reduced copy cannot be decoded the same)")


def read_dflash(source: Source, target: torch.nn.Module, layout: str) -> DFlashHeads:
    where = source.describe()
    tensors, vocab_ids = block_tensors(source, target)
    if any(k.endswith(".bias") for k in tensors):
        raise ValueError(f"{where}: biases ({next(k for k in tensors if k.endswith('.bias'))}): draftheads' DFlash layers have none")
    layer_cfg = _layer_config(source, layout)
    _refuse_causal_or_sliding(source, layout, layer_cfg)
    info = TargetInfo.from_model(target)
    layers = _feature_layers(source, layout, info.num_hidden_layers)
    block = int(source.config.get("block_size") or 0)
    if block < 2:
        raise ValueError(f"{where}: no block_size >= 2 in the config")
    return build_block_heads(source, target, tensors, layer_cfg, layers, block, _mask_token(source, layout), DFlashHeads,
                             {}, vocab_ids)


def block_tensors(source: Source, target: torch.nn.Module) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The checkpoint's tensors without a ``model.`` prefix, ``t2d``, a draft vocabulary's ``d2t``
    and LM head rows (returned as its target ids, None without one) or copies of the target's
    embedding / LM head (refused if they differ); a separate mask embedding is refused."""
    where = source.describe()
    if source.path.is_dir() and (source.path / "mask_embedding.pt").exists():
        raise ValueError(f"{where}: mask_embedding.pt (a separately trained mask vector): draftheads embeds the mask slots "
                         "with the target's row of the mask token; refused rather than decoded differently")
    tensors = {k[len("model."):] if k.startswith("model.") else k: v for k, v in source.tensors.items()}
    tensors.pop("t2d", None)
    vocab_ids = _draft_vocab_ids(tensors, target, where) if "d2t" in tensors else None
    _check_frozen_copies(tensors, target, where)
    return tensors, vocab_ids


def build_block_heads(source: Source, target: torch.nn.Module, tensors: dict[str, torch.Tensor], layer_cfg: dict,
                      layers: list[int], block: int, mask: int, heads_cls, family: dict,
                      vocab_ids: torch.Tensor | None):
    """Heads of ``heads_cls`` (DFlash or a family built on it) from a checkpoint's tensors and its
    layer geometry ``layer_cfg``; ``family``: the family's own config.json extra keys. Refuses
    tensors that do not match the layout, by name."""
    where = source.describe()
    info = TargetInfo.from_model(target)
    if "fc.weight" not in tensors:
        raise ValueError(f"{where}: no fc.weight")
    d = int(tensors["fc.weight"].shape[0])
    if d != info.hidden_size or tensors["fc.weight"].shape[1] != d * len(layers):
        raise ValueError(f"{where}: fc.weight {tuple(tensors['fc.weight'].shape)} does not fit a target of hidden size "
                         f"{info.hidden_size} and {len(layers)} feature layers")
    num_layers = len({k.split(".")[1] for k in tensors if k.startswith("layers.")})
    heads_ = int(layer_cfg.get("num_attention_heads") or 0)
    if not heads_:
        raise ValueError(f"{where}: the config has no num_attention_heads")
    rope = layer_cfg.get("rope_parameters") or {}
    scaling = layer_cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    theta = layer_cfg.get("rope_theta") or rope.get("rope_theta") or 1e6  # vLLM's DFlash default
    extra = {
        "num_attention_heads": heads_,
        "num_key_value_heads": int(layer_cfg.get("num_key_value_heads") or heads_),
        "head_dim": int(layer_cfg.get("head_dim") or d // heads_),
        "intermediate_size": int(layer_cfg["intermediate_size"]),
        "rms_norm_eps": float(layer_cfg.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(theta),
        "feature_layers": layers,
        "block_size": block,
        "mask_token_id": mask,
        **family,
    }
    if scaling:
        extra["rope_scaling"] = {k: v for k, v in scaling.items() if k != "rope_theta"}
        extra["max_position_embeddings"] = int(layer_cfg.get("max_position_embeddings") or 4096)
    num_heads = block - heads_cls.first_draft_slot(extra)
    config = HeadsConfig(head_type=heads_cls.head_type, num_heads=num_heads, num_layers=num_layers, hidden_size=d,
                         vocab_size=info.vocab_size, lm_head="shared", target=info, extra=extra)
    heads = heads_cls(config)
    expected = {k for k in heads.state_dict() if k != "token_counts"}
    missing, unexpected = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    if missing or unexpected:
        raise ValueError(f"{where}: {heads_cls.head_type} tensors do not match the layout: missing {missing[:6]}, "
                         f"unexpected {unexpected[:6]}")
    state = heads.state_dict()
    wrong = [k for k in expected if tuple(tensors[k].shape) != tuple(state[k].shape)]
    if wrong:
        raise ValueError(f"{where}: wrong shapes: " + ", ".join(f"{k} {tuple(tensors[k].shape)} != {tuple(state[k].shape)}" for k in wrong[:6]))
    counts = state["token_counts"]
    reduced = vocab_ids is not None and vocab_ids.numel() < info.vocab_size
    if reduced:
        counts[vocab_ids] = 1
    heads.load_state_dict({**{k: tensors[k].to(state[k].dtype) for k in expected}, "token_counts": counts})
    if reduced:  # the chain vLLM drafts, saved (tree.json) with the draft vocabulary it was trained over
        heads.use_plans(given_tree(StaticTree.chain(num_heads), int(vocab_ids.numel())), where)
    return heads


def _draft_vocab_ids(tensors: dict[str, torch.Tensor], target: torch.nn.Module, where: str) -> torch.Tensor:
    """The target ids of a reduced draft vocabulary (``d2t`` offsets: target id = i + d2t[i]),
    sorted; ``d2t`` and ``lm_head.weight`` leave ``tensors``. Refused unless the LM head is the
    target's own rows at those ids (draftheads scores with the target's LM head)."""
    d2t = tensors.pop("d2t")
    head = tensors.pop("lm_head.weight", None)
    ids = torch.arange(d2t.numel()) + d2t.long()
    vocab = target.get_output_embeddings().weight
    if head is None or head.shape[0] != ids.numel():
        raise ValueError(f"{where}: d2t without an lm_head.weight of {ids.numel()} rows (the draft vocabulary's scores)")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab.shape[0] or ids.unique().numel() != ids.numel()):
        raise ValueError(f"{where}: d2t maps draft ids outside the target's {vocab.shape[0]} tokens or twice to one token")
    ref = vocab.detach().float().cpu()[ids]
    if tuple(head.shape) != tuple(ref.shape) or not torch.allclose(head.float(), ref, rtol=1e-2, atol=1e-3):
        raise ValueError(f"{where}: lm_head.weight is not the target's LM head rows at the d2t ids: draftheads' DFlash heads "
                         "score with the target's own LM head (a trained draft LM head cannot be decoded the same)")
    return ids.sort().values
