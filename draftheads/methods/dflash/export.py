"""DFlash heads -> the z-lab/SpecForge layout vLLM's DFlash drafter loads (``method: dflash``).

vLLM 0.32 reads it as ``DFlashDraftModel`` -> ``DFlashQwen3ForCausalLM``
(vllm/model_executor/models/qwen3_dflash.py): Qwen3 decoder layers with q/k norms, ``fc`` over
the aux hidden states in layer order, ``hidden_norm`` on the context, ``norm`` before the target's
LM head. Tensor names carry no ``model.`` prefix; the embedding and LM head are not shipped, so
vLLM shares the target's (what draftheads uses: the mask slots embed the target's row of the
mask token, exactly as vLLM's ``embed_tokens[mask_token_id]``).

What vLLM would silently change, and how this export pins it:
- causality: every layer is written ``full_attention`` and ``dflash_config.causal`` false (vLLM
  resolves a per-layer causal flag from ``is_causal``, then ``dflash_config.causal``, then the
  layer types; a causal flag would turn the block mask causal without a word);
- the mask embedding: no ``mask_embedding.pt`` and no embedding are written (either would make
  vLLM embed the mask slots with another vector than the one the heads were trained with);
- layer numbering: z-lab's ``target_layer_ids`` are layer OUTPUTS, draftheads' feature f the
  INPUT of layer f, so the ids are f-1 (vLLM adds the 1 back for its aux layers);
- the draft length: vLLM queries 1 + K tokens, so a block of B serves exactly K = B-1 (a
  shorter block changes every slot's output under bidirectional attention): other K are refused;
- a calibrated draft vocabulary (``draft_vocab_size`` of the heads' greedy batch-1 plan entry): vLLM
  has the slot for it. ``config.draft_vocab_size`` Vd sizes the drafter's own ``lm_head`` [Vd, H],
  loaded from ``lm_head.weight``, and ``d2t`` (target id = i + d2t[i]) becomes its
  ``draft_id_to_target_id``; ``compute_logits`` scatters the Vd logits to those target ids, -inf
  elsewhere (vllm/model_executor/models/qwen3_dflash.py:803-810, 836-851, 896-900). A loaded
  ``lm_head`` makes the model "own" one and, being [Vd, H], it is never equal to the target's, so
  it is kept, not replaced by the target's (vllm/v1/spec_decode/llm_base_proposer.py:1508-1556;
  vllm/v1/worker/gpu/spec_decode/dflash/utils.py:62-72). The rows written are the target LM head's
  rows of the draft ids, in increasing id order as draftheads ranks them, so the argmax (ties to
  the lower id in both) drafts what draftheads drafts. vLLM has one draft vocabulary per
  drafter: plan entries of other batch sizes or temperatures with another size are not carried.
"""
from __future__ import annotations

import torch

from ...plans import primary
from ...export.common import EngineFolder, ExportError, check_tensors, dtype_name, verifier_lm_head

FORMAT = "vllm"
ARCHITECTURE = "DFlashDraftModel"


def dflash_shapes(heads) -> dict[str, tuple[int, ...]]:
    """Every tensor of the layout (engine names) and its shape."""
    cfg, ex = heads.config, heads.config.extra
    d, nh, kv, hd, inter = cfg.hidden_size, ex["num_attention_heads"], ex["num_key_value_heads"], ex["head_dim"], ex["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (d, d * len(ex["feature_layers"])), "hidden_norm.weight": (d,), "norm.weight": (d,),
    }
    for i in range(cfg.num_layers):
        p = f"layers.{i}"
        shapes.update({
            f"{p}.input_layernorm.weight": (d,), f"{p}.post_attention_layernorm.weight": (d,),
            f"{p}.self_attn.q_proj.weight": (nh * hd, d), f"{p}.self_attn.k_proj.weight": (kv * hd, d),
            f"{p}.self_attn.v_proj.weight": (kv * hd, d), f"{p}.self_attn.o_proj.weight": (d, nh * hd),
            f"{p}.self_attn.q_norm.weight": (hd,), f"{p}.self_attn.k_norm.weight": (hd,),
            f"{p}.mlp.gate_proj.weight": (inter, d), f"{p}.mlp.up_proj.weight": (inter, d),
            f"{p}.mlp.down_proj.weight": (d, inter),
        })
    return shapes


def draft_config(heads, verifier_cfg: dict) -> dict:
    """The Qwen3-style config.json of the draft, with the DFlash keys vLLM reads."""
    cfg, ex = heads.config, heads.config.extra
    text = verifier_cfg.get("text_config") or verifier_cfg
    n_target = cfg.target.num_hidden_layers if cfg.target else int(text.get("num_hidden_layers", 0))
    theta = float(ex["rope_theta"])  # always written: vLLM's DFlash defaults a missing one to 1e6
    config = {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": ex["intermediate_size"],
        "num_attention_heads": ex["num_attention_heads"],
        "num_key_value_heads": ex["num_key_value_heads"],
        "head_dim": ex["head_dim"],
        "num_hidden_layers": cfg.num_layers,
        "rms_norm_eps": ex["rms_norm_eps"],
        "rope_theta": theta,
        "rope_parameters": {**(ex.get("rope_scaling") or {"rope_type": "default"}), "rope_theta": theta},
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "max_position_embeddings": int(ex.get("max_position_embeddings") or text.get("max_position_embeddings") or 4096),
        "vocab_size": cfg.vocab_size,
        "layer_types": ["full_attention"] * cfg.num_layers,
        "block_size": heads.block_size,
        "num_target_layers": n_target,
        "target_hidden_size": cfg.hidden_size,
        "dflash_config": {
            "mask_token_id": heads.mask_token_id,
            "target_layer_ids": [f - 1 for f in ex["feature_layers"]],
            "causal": False,
        },
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if text.get(key) is not None:
            config[key] = text[key]
    return config


def export(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    cfg, ex = heads.config, heads.config.extra
    if ex.get("mask_token_id") is None:
        raise ExportError("these dflash heads have no mask token (dflash_config.mask_token_id): they were never trained")
    slots = heads.block_size - 1
    if num_speculative_tokens is not None and int(num_speculative_tokens) != slots:
        raise ExportError(
            f"vLLM's DFlash drafter queries 1 + num_speculative_tokens tokens, so a block of {heads.block_size} "
            f"serves exactly {slots} (got {num_speculative_tokens}): fewer mask slots change every slot's output "
            "under bidirectional attention. Export without it, or train heads with block_size K+1"
        )
    if ex["feature_layers"] != sorted(ex["feature_layers"]):  # refused at build time too; fc's columns rely on it
        raise ExportError(f"feature layers {ex['feature_layers']} are not in increasing order: vLLM concatenates aux layers so")
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items() if k != "token_counts"}
    config = draft_config(heads, verifier_cfg)
    config["torch_dtype"] = dtype_name(state)
    notes = [
        f"load with speculative_config={{'method': 'dflash', 'model': DIR, 'num_speculative_tokens': {slots}}}",
        f"target_layer_ids {config['dflash_config']['target_layer_ids']} (z-lab: output of layer j) from draftheads "
        f"feature_layers {ex['feature_layers']} (input of layer f)",
        f"mask token {heads.mask_token_id}: the target's own embedding row (no embedding is shipped: vLLM shares the target's)",
    ]
    shapes = dflash_shapes(heads)
    vocab = draft_vocab_tensors(heads, verifier, state["fc.weight"].dtype)
    if vocab is not None:
        state.update(vocab)
        size = int(vocab["d2t"].numel())
        config["draft_vocab_size"] = size
        shapes.update({"lm_head.weight": (size, cfg.hidden_size), "d2t": (size,)})
        notes.append(f"draft vocabulary: the {size} most frequent training tokens (the heads' calibrated "
                     f"draft_vocab_size): lm_head.weight = the target LM head's rows of those ids, d2t their offsets")
    folder = EngineFolder(config, dict(state), notes)
    check_tensors(folder, shapes, "vLLM DFlash")
    return folder


def draft_vocab_tensors(heads, verifier: str | None, dtype: torch.dtype) -> dict[str, torch.Tensor] | None:
    """``lm_head.weight`` (the target LM head's rows of the heads' draft vocabulary, increasing
    ids) and ``d2t`` (int64, target id = i + d2t[i]) for heads with a calibrated draft vocabulary;
    None when they draft over the whole vocabulary (vLLM then shares the target's LM head)."""
    entry = primary(heads.plans)
    ids = heads.draft_vocab(None if entry is None else entry.draft_vocab_size)
    if ids is None:
        return None
    ids = ids.cpu()
    try:
        weight = verifier_lm_head(verifier, heads.config)
    except ExportError as e:
        raise ExportError(f"these dflash heads draft from a {ids.numel()}-token draft vocabulary (draft_vocab_size in "
                          f"tree.json), which vLLM holds as the LM head's rows: {e}") from None
    return {"lm_head.weight": weight[ids].to(dtype).contiguous(),
            "d2t": (ids - torch.arange(ids.numel())).to(torch.int64)}

