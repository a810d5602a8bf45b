"""DFlash heads <-> transformers' own DFlash drafter (``MuseGlimmerAssistantModel``), both ways.

transformers (5.25) drafts with a DFlash block drafter itself: ``target.generate(...,
assistant_model=DRAFT, speculation_type="dflash")`` builds ``DFlashTokenCandidateGenerator``
(transformers/generation/candidate_generator.py), which runs ``MuseGlimmerAssistantModel``
(transformers/models/muse_glimmer_assistant/) over the target's hidden states. Its architecture is
draftheads' DFlash draft, under other names and with other defaults; what maps, and how:

- tensors: ``fc`` and ``hidden_norm`` are ``encoder.fc`` and ``encoder.output_norm_enc`` (the
  context projection); ``layers.i.*`` (Qwen3 layers: q/k RMSNorm before RoPE, SwiGLU) and
  ``norm`` keep their names. The context enters every layer's k/v projections without the
  layer's input norm in both. No embedding and no LM head are shipped: the generator embeds the
  block ``[root, mask x (B-1)]`` with the TARGET's input embedding and scores slots 1.. with the
  target's LM head, as draftheads does;
- feature layers: the generator asks the target for ``hidden_states[j + 1]`` for each of
  ``target_layer_ids`` j (index 0 is the embedding output), so j = f - 1 for draftheads'
  feature f (the state entering layer f);
- attention: ``layer_types`` defaults to ``sliding_attention`` with a 2048 window in
  transformers; every layer is written ``full_attention``, as draftheads attends;
- RoPE: ``rope_parameters`` carries the heads' theta and scaling, computed by the same
  ``ROPE_INIT_FUNCTIONS`` draftheads uses. ``dynamic`` and ``longrope`` are refused: transformers'
  rotary embedding switches those frequencies with the sequence length (``dynamic_rope_update``),
  draftheads' layers keep one set;
- draft length: the generator always drafts ``block_size - 1`` tokens (the whole block), so a
  ``num_speculative_tokens`` other than that is refused;
- draft vocabulary: the generator scores with the target's whole LM head, and has no slot for a
  restricted one: heads whose batch-1 plans draft from a calibrated ``draft_vocab_size`` are
  refused (name the entries);
- the mask embedding: the generator embeds the block with the target's embedding module but
  WITHOUT its ``embed_norm`` when the module has one (Muse Glimmer, Inkling: ``embed_norm``), while draftheads
  embeds through the module whole: such targets are refused (checked on the verifier's config,
  built on the meta device).

`read_transformers` reads such a folder back into dflash heads through the z-lab reader
(`imports.read_dflash`), with transformers' own defaults filled in from its config class, so a
checkpoint that relies on the defaults (sliding layers) is refused there by name.
"""
from __future__ import annotations

from typing import Any

import torch

from ...export.common import EngineFolder, ExportError, check_tensors, dtype_name
from ...export.sources import Source
from ...plans import SPECULATIVE
from .export import dflash_shapes
from .imports import read_dflash

MODEL_TYPE = "muse_glimmer_assistant"
ARCHITECTURE = "MuseGlimmerAssistantModel"
#: draftheads' tensor name -> transformers' (the context projection); every other name is kept.
RENAMED = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
#: rope types whose frequencies transformers recomputes with the sequence length.
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


def transformers_shapes(heads) -> dict[str, tuple[int, ...]]:
    """Every tensor of the layout (transformers' names) and its shape."""
    return {RENAMED.get(name, name): shape for name, shape in dflash_shapes(heads).items()}


def _token_id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def assistant_config(heads, verifier_cfg: dict) -> dict:
    """The ``MuseGlimmerAssistantConfig`` of the draft: geometry, RoPE and the DFlash keys."""
    cfg, ex = heads.config, heads.config.extra
    text = verifier_cfg.get("text_config") or verifier_cfg
    theta = float(ex["rope_theta"])
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": ex["intermediate_size"],
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": ex["num_attention_heads"],
        "num_key_value_heads": ex["num_key_value_heads"],
        "head_dim": ex["head_dim"],
        "rms_norm_eps": ex["rms_norm_eps"],
        "rope_parameters": {**(ex.get("rope_scaling") or {"rope_type": "default"}), "rope_theta": theta},
        "max_position_embeddings": int(ex.get("max_position_embeddings") or text.get("max_position_embeddings") or 4096),
        "layer_types": ["full_attention"] * cfg.num_layers,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "block_size": heads.block_size,
        "mask_token_id": heads.mask_token_id,
        "target_layer_ids": [f - 1 for f in ex["feature_layers"]],
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # the class defaults are another model's ids
        config[key] = _token_id(text.get(key))
    return config


def _refuse_draft_vocab(heads) -> None:
    """transformers' generator scores every slot with the target's whole LM head."""
    plans = getattr(heads, "plans", None)
    restricted = [e for e in (plans.entries if plans is not None else ())
                  if e.mode == SPECULATIVE and e.batch_size == 1 and heads.draft_vocab(e.draft_vocab_size) is not None]
    if restricted:
        which = "; ".join(f"device {e.device_type or 'any'}, temperature {e.temperature}: draft_vocab_size "
                          f"{e.draft_vocab_size}" for e in restricted)
        raise ExportError(
            f"these dflash heads' batch-1 plans draft from a restricted vocabulary ({which}, in tree.json), and "
            "transformers' DFlash generator scores every slot with the target's whole LM head (it has no draft "
            "vocabulary): it would draft other tokens than draftheads. Export a copy of the heads folder without its "
            "tree.json (draftheads then drafts from the whole vocabulary too), or use --format vllm, which holds it"
        )


def _refuse_rope(heads) -> None:
    rope_type = (heads.config.extra.get("rope_scaling") or {}).get("rope_type", "default")
    if rope_type in LENGTH_DEPENDENT_ROPE:
        raise ExportError(
            f"rope type {rope_type!r}: transformers' rotary embedding recomputes these frequencies with the sequence "
            "length (dynamic_rope_update), while draftheads' DFlash layers keep the ones computed once, so the two "
            "would draft differently on long contexts; no transformers export for it"
        )


def embedding_norm(verifier_cfg: dict) -> str | None:
    """The class of the target's input embedding when it carries an ``embed_norm`` (which
    transformers' DFlash generator bypasses), from the verifier's config, built on the meta device
    (no weights). None: no such norm. Raises ExportError when the config builds no model."""
    if not verifier_cfg.get("model_type"):
        raise ExportError("the verifier's config.json has no model_type")
    from transformers import AutoConfig, AutoModel

    values = {k: v for k, v in verifier_cfg.items() if k != "model_type"}
    try:  # the base model is enough: the embedding is what is asked about
        config = AutoConfig.for_model(verifier_cfg["model_type"], **values)
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    except Exception as e:  # noqa: BLE001 - any failure to build says: not checkable here
        raise ExportError(f"the verifier's config does not build a model in this transformers, so its input "
                          f"embedding cannot be checked ({type(e).__name__}: {e})") from None
    embedding = model.get_input_embeddings()
    return type(embedding).__name__ if getattr(embedding, "embed_norm", None) is not None else None


def _check_embedding(verifier: str | None, verifier_cfg: dict) -> str:
    """Refuse a target whose embedding has an ``embed_norm``; returns the note that says what was checked."""
    if not verifier_cfg:
        return (f"the target's input embedding was not checked ({verifier!r} is not a local folder): transformers "
                "embeds the mask slots without an embed_norm, draftheads with the embedding module whole")
    name = embedding_norm(verifier_cfg)
    if name is not None:
        raise ExportError(
            f"the target's input embedding ({name}) applies an embed_norm, which transformers' DFlash generator "
            "bypasses for the mask slots while these heads were trained through it: the draft would read other "
            "inputs in transformers; no transformers export for this target"
        )
    return "the target's input embedding has no embed_norm: transformers embeds the block as draftheads does"


def export(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    ex = heads.config.extra
    if ex.get("mask_token_id") is None:
        raise ExportError("these dflash heads have no mask token (dflash_config.mask_token_id): they were never trained")
    slots = heads.block_size - 1
    if num_speculative_tokens is not None and int(num_speculative_tokens) != slots:
        raise ExportError(
            f"transformers' DFlash generator always drafts block_size - 1 = {slots} tokens (got "
            f"num_speculative_tokens {num_speculative_tokens}): a shorter block changes every slot's output under "
            "bidirectional attention. Export without it, or train heads with block_size K+1"
        )
    if ex["feature_layers"] != sorted(ex["feature_layers"]):  # refused at build time too; fc's columns rely on it
        raise ExportError(f"feature layers {ex['feature_layers']} are not in increasing order: transformers "
                          "concatenates the target layers so")
    _refuse_draft_vocab(heads)
    _refuse_rope(heads)
    embedding_note = _check_embedding(verifier, verifier_cfg)
    state = {RENAMED.get(k, k): v.detach().cpu() for k, v in heads.state_dict().items() if k != "token_counts"}
    config = assistant_config(heads, verifier_cfg)
    config["dtype"] = dtype_name(state)
    notes = [
        f"load with AutoModel.from_pretrained(DIR); decode with target.generate(..., assistant_model=draft, "
        f"speculation_type='dflash'): {slots} draft tokens per step (block_size {heads.block_size})",
        f"target_layer_ids {config['target_layer_ids']} (transformers reads hidden_states[j + 1]) from draftheads "
        f"feature_layers {ex['feature_layers']} (the state entering layer f)",
        f"mask token {heads.mask_token_id}: the target's own embedding row (no embedding is shipped)",
        "every layer full_attention (transformers' default is sliding_attention)",
        embedding_note,
    ]
    folder = EngineFolder(config, state, notes)
    check_tensors(folder, transformers_shapes(heads), "transformers DFlash")
    return folder


# -- back: a transformers DFlash drafter -> dflash heads -----------------------------------------
def is_transformers_dflash(source: Source) -> bool:
    cfg = source.config
    return cfg.get("model_type") == MODEL_TYPE or any(str(a).startswith("MuseGlimmerAssistant")
                                                        for a in cfg.get("architectures") or [])


def resolved_config(source: Source) -> dict:
    """The checkpoint's config as transformers loads it: its config class fills in the defaults
    the file leaves out (sliding layers, the rope theta, the DFlash keys)."""
    from transformers import AutoConfig

    values = {k: v for k, v in source.config.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(MODEL_TYPE, **values).to_dict()
    except Exception as e:  # noqa: BLE001 - transformers' own validation, named
        raise ValueError(f"{source.describe()}: not a valid {MODEL_TYPE} config ({type(e).__name__}: {e})") from None


def read_transformers(source: Source, target: torch.nn.Module):
    """A ``MuseGlimmerAssistantModel`` folder as dflash heads for ``target``, read by the z-lab
    reader (which refuses, by name, sliding or causal layers and anything else draftheads
    would decode differently)."""
    where = source.describe()
    embedding = target.get_input_embeddings()
    if getattr(embedding, "embed_norm", None) is not None:
        raise ValueError(f"{where}: the target's input embedding ({type(embedding).__name__}) applies an embed_norm, "
                         "which transformers' DFlash generator bypasses for the mask slots and draftheads does not")
    cfg = resolved_config(source)
    if cfg.get("hidden_act") != "silu":
        raise ValueError(f"{where}: hidden_act {cfg.get('hidden_act')!r}: draftheads' DFlash layers are SwiGLU (silu)")
    renamed = {v: k for k, v in RENAMED.items()}
    tensors = {}
    for name, tensor in source.tensors.items():
        name = name[len("model."):] if name.startswith("model.") else name
        tensors[renamed.get(name, name)] = tensor
    zlab = {**cfg, "dflash_config": {"target_layer_ids": cfg["target_layer_ids"], "mask_token_id": cfg["mask_token_id"]}}
    return read_dflash(Source(source.path, zlab, tensors, source.files), target, "dflash")
