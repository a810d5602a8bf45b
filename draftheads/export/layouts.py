"""What the engine layouts of draft layers share: the decoder layer's tensor names and shapes, and
the conversions between draftheads' tensors and the engines' (d2t offsets, t2d masks, the aux
layer ids, fc's column order).

Each method's whole shape table sits with its exporter, which must write exactly it
(`methods/medusa/export.py`, `methods/eagle/export.py`, `methods/eagle3/export.py`). Each fact
names the engine's model file it comes from, read in the installed vLLM (0.32) and SGLang (0.5.23):

- EAGLE-1 (vllm/model_executor/models/llama_eagle.py, sglang/srt/models/llama_eagle.py, SafeAILab
  eagle/model/cnets.py): ``fc`` over cat(embedding, feature); layer 0 has no input_layernorm;
  vLLM's fc has no bias, SGLang's always has one.
- EAGLE-3 (vllm/model_executor/models/llama_eagle3.py, sglang/srt/models/llama_eagle3.py):
  ``midlayer.*`` (read as ``layers.0.*``), ``hidden_norm``, ``norm``, ``lm_head`` over the draft
  vocabulary, ``d2t`` as offsets, ``t2d`` a bool mask (ignored by both engines); EAGLE 3.1 in vLLM:
  ``fc_norm.{j}.weight`` [H] per captured layer (config ``fc_norm: true``) and ``norm_output: true``
  (no tensor); ``norm_before_fc: true``: ``input_norm.weight`` [n*H], one norm over the whole fc input
  (its entries in fc's column order).
"""
from __future__ import annotations

import torch

# -- the decoder layer of an EAGLE draft ---------------------------------------------------------
#: draftheads' DraftLayer parameter -> the Llama decoder layer's name (both engines use these).
LAYER_NAMES = {
    "q_proj.weight": "self_attn.q_proj.weight",
    "k_proj.weight": "self_attn.k_proj.weight",
    "v_proj.weight": "self_attn.v_proj.weight",
    "o_proj.weight": "self_attn.o_proj.weight",
    "gate_proj.weight": "mlp.gate_proj.weight",
    "up_proj.weight": "mlp.up_proj.weight",
    "down_proj.weight": "mlp.down_proj.weight",
    "post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "input_layernorm.weight": "input_layernorm.weight",
}


def layer_shapes(geometry: dict, hidden: int, attn_in: int, input_norm: bool) -> dict[str, tuple[int, ...]]:
    """Llama decoder-layer tensors (engine names, no prefix) for a draft layer."""
    heads, kv, hd, inter = (geometry[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))
    shapes = {
        "self_attn.q_proj.weight": (heads * hd, attn_in),
        "self_attn.k_proj.weight": (kv * hd, attn_in),
        "self_attn.v_proj.weight": (kv * hd, attn_in),
        "self_attn.o_proj.weight": (hidden, heads * hd),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "post_attention_layernorm.weight": (hidden,),
    }
    if input_norm:
        shapes["input_layernorm.weight"] = (hidden,)
    return shapes


# -- EAGLE-3 ---------------------------------------------------------------------------------------
def d2t_offsets(draft_to_target: torch.Tensor) -> torch.Tensor:
    """draftheads keeps absolute target ids per draft index; the engines store offsets:
    target id = i + d2t[i]."""
    return (draft_to_target.long() - torch.arange(draft_to_target.numel())).contiguous()


def d2t_absolute(offsets: torch.Tensor) -> torch.Tensor:
    return offsets.long() + torch.arange(offsets.numel())


def t2d_mask(draft_to_target: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool mask over the target vocabulary: True where a target id is in the draft vocabulary."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[draft_to_target.long()] = True
    return mask


# -- aux hidden-state layer ids --------------------------------------------------------------------
# draftheads' feature layer f is HF ``hidden_states[f]``: the residual stream entering decoder layer f
# (f = 0: the embeddings). f = L, the LAST entry, is the output after the final norm.
# vLLM: id k = the residual stream after k layers (0 = embeddings), captured before layer k
#   (vllm/model_executor/models/interfaces.py `_maybe_add_hidden_state`); k = L would be the
#   pre-norm output, which differs from draftheads' post-norm f = L.
# SGLang: an explicit id j captures the input of layer j + 1 ("the output of layer j";
#   sglang/srt/models/llama.py `set_eagle3_layers_to_capture` adds 1).
# Both engines concatenate the captured states in layer order, whatever order the ids are listed in.


def vllm_aux_ids(feature_layers: list[int], num_target_layers: int) -> list[int]:
    """vLLM aux ids for draftheads feature layers (the same numbers, sorted); refuses what vLLM cannot capture."""
    _check_capturable(feature_layers, num_target_layers, "vLLM")
    return sorted(feature_layers)


def sglang_aux_ids(feature_layers: list[int], num_target_layers: int) -> list[int]:
    _check_capturable(feature_layers, num_target_layers, "SGLang")
    if 0 in feature_layers:
        raise ValueError(
            "feature layer 0 (the embeddings) has no SGLang aux-layer id (SGLang's id j captures the output of "
            "layer j): SGLang cannot feed these EAGLE-3 heads; export them with --format vllm"
        )
    return [f - 1 for f in sorted(feature_layers)]


def feature_layers_from_vllm(ids: list[int]) -> list[int]:
    return sorted(int(i) for i in ids)


def feature_layers_from_sglang(ids: list[int]) -> list[int]:
    return sorted(int(i) + 1 for i in ids)


def default_engine_feature_layers(num_target_layers: int) -> list[int]:
    """What both engines capture when a checkpoint names no layers: the inputs of layers 2, L/2, L-3."""
    return sorted([2, num_target_layers // 2, num_target_layers - 3])


def _check_capturable(feature_layers: list[int], num_target_layers: int, engine: str) -> None:
    if len(set(feature_layers)) != len(feature_layers):
        raise ValueError(
            f"feature layers {feature_layers} repeat a layer: {engine} captures each layer once, so the fused input "
            "would be narrower than the heads' fc expects"
        )
    if num_target_layers in feature_layers:
        raise ValueError(
            f"feature layer {num_target_layers} is the target's output after its final norm; {engine} captures only "
            f"residual streams entering layers 0..{num_target_layers - 1}: these heads cannot be served there"
        )


def fc_column_order(feature_layers: list[int], width: int) -> torch.Tensor:
    """Column permutation of EAGLE-3's fc taking draftheads' concat order (as listed) to the engines'
    (sorted by layer)."""
    order = sorted(range(len(feature_layers)), key=lambda i: feature_layers[i])
    return torch.cat([torch.arange(i * width, (i + 1) * width) for i in order])
