"""DSpark heads -> the layout vLLM 0.32 loads as ``Qwen3DSparkModel`` (``method: dspark``).

vLLM reads it in vllm/model_executor/models/qwen3_dspark.py (``Qwen3DSparkForCausalLM``: the
DFlash Qwen3 backbone of qwen3_dflash.py plus ``DSparkMarkovHead`` and ``DSparkConfidenceHead``)
and drafts with vllm/v1/worker/gpu/spec_decode/dspark/speculator.py: one parallel block forward,
then left to right ``argmax(base + markov_w2(markov_w1[prev]))`` per slot. The config is the one
DeepSpec writes for its dense Qwen3 drafts (deepspec/modeling/dspark/qwen3/config.py): a Qwen3
config with ``architectures: ["Qwen3DSparkModel"]``, ``block_size``, top-level ``target_layer_ids``
(layer outputs: draftheads' feature f is f-1; vLLM adds the 1 back for its aux layers, in
vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py) and ``mask_token_id``, ``markov_rank``,
``markov_head_type``, ``enable_confidence_head``, ``confidence_head_with_markov``. Tensors carry
no ``model.`` prefix (vLLM adds it); the embedding and LM head are the target's, shared by vLLM
(vllm/v1/worker/gpu/spec_decode/dspark/utils.py) unless a draft vocabulary ships its rows.

Pinned here so that vLLM computes what draftheads computes:
- ``sample_from_anchor`` written explicitly (vLLM's Qwen3 DSpark defaults it to true, its
  speculators mapping to false) and the block's width: vLLM queries ``num_speculative_tokens``
  slots with it on, ``1 + num_speculative_tokens`` without, so a block serves exactly K;
- every layer ``full_attention`` and ``is_causal: false`` (vLLM's per-layer causality rule,
  qwen3_dflash.py ``_dflash_layer_causal``);
- a calibrated draft vocabulary: ``draft_vocab_size`` Vd, ``lm_head.weight`` = the target LM
  head's rows of those ids, ``d2t`` their offsets, and ``markov_w2`` cut to the same rows (vLLM's
  Markov projection is [Vd, r], biasing the draft-vocabulary logits before the d2t map);
- the confidence head only with ``enable_confidence_head`` (vLLM drops a shipped head without it).

vLLM runs DSpark only on its Model Runner V2 (vllm/config/vllm.py: "DSpark is implemented only by
the V2 GPU model runner"), which needs Triton on a GPU: the CPU build refuses it. `check_engine`
says so by name before a folder is written for an installed vLLM that cannot serve it.
"""
from __future__ import annotations

import torch

from ...export.common import EngineFolder, ExportError, check_tensors, dtype_name
from ..dflash.export import dflash_shapes, draft_config, draft_vocab_tensors
from ..runner_check import require_runner

ARCHITECTURE = "Qwen3DSparkModel"


def check_engine() -> None:
    """Refuse, by name, an installed vLLM that cannot serve DSpark (no V2 runner, or too old)."""
    require_runner("DSpark", ARCHITECTURE)


def dspark_shapes(heads) -> dict[str, tuple[int, ...]]:
    cfg, rank = heads.config, heads.markov_rank
    shapes = dflash_shapes(heads)
    shapes.update({"markov_head.markov_w1.weight": (cfg.vocab_size, rank),
                   "markov_head.markov_w2.weight": (cfg.vocab_size, rank)})
    if heads.confidence_head is not None:
        width = heads.confidence_head.proj.in_features
        shapes.update({"confidence_head.proj.weight": (1, width), "confidence_head.proj.bias": (1,)})
    return shapes


def dspark_config(heads, verifier_cfg: dict) -> dict:
    """The Qwen3 config.json of the draft with the DSpark keys vLLM reads."""
    config = draft_config(heads, verifier_cfg)
    dflash = config.pop("dflash_config")
    config.update({
        "architectures": [ARCHITECTURE],
        "target_layer_ids": dflash["target_layer_ids"],
        "mask_token_id": dflash["mask_token_id"],
        "is_causal": False,
        "sample_from_anchor": heads.first_slot == 0,
        "markov_rank": heads.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": heads.confidence_head is not None,
        "confidence_head_with_markov": heads.confidence_head is not None and heads.confidence_with_markov,
    })
    return config


def export(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    cfg = heads.config
    if cfg.extra.get("mask_token_id") is None:
        raise ExportError("these dspark heads have no mask token (mask_token_id): they were never trained")
    k = cfg.num_heads
    if num_speculative_tokens is not None and int(num_speculative_tokens) != k:
        raise ExportError(
            f"vLLM's DSpark drafter queries {'num_speculative_tokens' if heads.first_slot == 0 else '1 + num_speculative_tokens'} "
            f"slots, so a block of {heads.block_size} serves exactly {k} (got {num_speculative_tokens}): fewer slots change every "
            f"slot's output under bidirectional attention. Export without it, or train heads with block_size "
            f"{num_speculative_tokens + 1 - heads.first_slot}"
        )
    state = {k_: v.detach().cpu() for k_, v in heads.state_dict().items() if k_ != "token_counts"}
    config = dspark_config(heads, verifier_cfg)
    config["torch_dtype"] = dtype_name(state)
    shapes = dspark_shapes(heads)
    notes = [
        f"load with speculative_config={{'method': 'dspark', 'model': DIR, 'num_speculative_tokens': {k}}} "
        "(vLLM's Model Runner V2: a GPU build with Triton)",
        f"target_layer_ids {config['target_layer_ids']} (output of layer j) from draftheads feature_layers "
        f"{cfg.extra['feature_layers']} (input of layer f); sample_from_anchor {config['sample_from_anchor']}",
    ]
    vocab = draft_vocab_tensors(heads, verifier, state["fc.weight"].dtype)
    if vocab is not None:
        size = int(vocab["d2t"].numel())
        ids = torch.arange(size) + vocab["d2t"]  # the draft vocabulary's target ids, increasing
        state.update(vocab)
        state["markov_head.markov_w2.weight"] = state["markov_head.markov_w2.weight"][ids].contiguous()
        config["draft_vocab_size"] = size
        shapes.update({"lm_head.weight": (size, cfg.hidden_size), "d2t": (size,),
                       "markov_head.markov_w2.weight": (size, heads.markov_rank)})
        notes.append(f"draft vocabulary: the {size} most frequent training tokens (lm_head.weight, markov_w2 rows, d2t)")
    folder = EngineFolder(config, dict(state), notes)
    check_tensors(folder, shapes, "vLLM DSpark")
    return folder
