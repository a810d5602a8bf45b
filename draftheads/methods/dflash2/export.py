"""DFlash2 heads -> the z-lab layout vLLM 0.32 loads as ``DFlash2DraftModel`` (``method: dflash``).

vLLM reads it in vllm/model_executor/models/qwen3_dflash2.py (``DFlash2Qwen3ForCausalLM``:
DFlash's Qwen3 layers, each with ``attention_conv`` and ``mlp_conv`` (``base_kernel`` [2, taps, H],
``kernel_projection`` [2 taps G, H]), plus ``candidate_selector`` (``predecessor_codebook``,
``successor_codebook`` [V, r], ``hidden_projection`` [r, H])) and drafts with
vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py (the selector's walk over the unary top-K).
The config is DFlash's (methods/dflash/export.py: ``dflash_config`` with ``mask_token_id``,
``target_layer_ids``, ``causal: false``) with ``architectures: ["DFlash2DraftModel"]`` and the
selector and convolution sizes in ``dflash_config`` (``conv_kernel_size``, ``conv_group_size``,
``selector_rank``, ``selector_top_k``), where vLLM reads them; the checkpoint scalars
(``input_embedding_scale``, ``output_multiplier``, ``final_logit_softcapping``) are written when
they are not 1 / none.

vLLM sizes the convolution's block from the request (``1 + num_speculative_tokens``): a block of
B serves exactly K = B - 1, as DFlash's. It runs DFlash2 only on its Model Runner V2 ("DFlash
candidate heads exist only in the V2 speculator. On V1 the same checkpoint drafts through
DFlashProposer, which never calls it, so the draft would degrade to DFlash1 silently", hence its
refusal there): `check_engine` names that before writing for an installed vLLM without it.
"""
from __future__ import annotations

from ...export.common import EngineFolder, ExportError, check_tensors, dtype_name
from ..dflash.export import dflash_shapes, draft_config
from ..runner_check import require_runner

ARCHITECTURE = "DFlash2DraftModel"


def check_engine() -> None:
    require_runner("DFlash2", ARCHITECTURE)


def dflash2_shapes(heads) -> dict[str, tuple[int, ...]]:
    cfg, ex = heads.config, heads.config.extra
    d, taps, groups = cfg.hidden_size, ex["conv_kernel_size"], cfg.hidden_size // ex["conv_group_size"]
    shapes = dflash_shapes(heads)
    for i in range(cfg.num_layers):
        for conv in ("attention_conv", "mlp_conv"):
            shapes[f"layers.{i}.{conv}.base_kernel"] = (2, taps, d)
            shapes[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * taps * groups, d)
    rank = ex["selector_rank"]
    shapes.update({"candidate_selector.predecessor_codebook": (cfg.vocab_size, rank),
                   "candidate_selector.successor_codebook": (cfg.vocab_size, rank),
                   "candidate_selector.hidden_projection.weight": (rank, d)})
    return shapes


def export(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    ex = heads.config.extra
    if ex.get("mask_token_id") is None:
        raise ExportError("these dflash2 heads have no mask token (dflash_config.mask_token_id): they were never trained")
    slots = heads.block_size - 1
    if num_speculative_tokens is not None and int(num_speculative_tokens) != slots:
        raise ExportError(
            f"vLLM's DFlash2 drafter queries 1 + num_speculative_tokens tokens and sizes its convolution's block by them, so "
            f"a block of {heads.block_size} serves exactly {slots} (got {num_speculative_tokens}). Export without it, or "
            "train heads with block_size K+1"
        )
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items() if k != "token_counts"}
    config = draft_config(heads, verifier_cfg)
    config["architectures"] = [ARCHITECTURE]
    config["dflash_config"].update({key: ex[key] for key in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                             "selector_top_k")})
    for key, neutral in (("input_embedding_scale", 1.0), ("output_multiplier", 1.0), ("final_logit_softcapping", None)):
        if ex.get(key, neutral) not in (neutral, 0.0):
            config["dflash_config"][key] = ex[key]
    config["torch_dtype"] = dtype_name(state)
    notes = [
        f"load with speculative_config={{'method': 'dflash', 'model': DIR, 'num_speculative_tokens': {slots}}} "
        "(vLLM's Model Runner V2: a GPU build with Triton)",
        f"target_layer_ids {config['dflash_config']['target_layer_ids']} (output of layer j) from draftheads feature_layers "
        f"{ex['feature_layers']} (input of layer f)",
    ]
    folder = EngineFolder(config, dict(state), notes)
    check_tensors(folder, dflash2_shapes(heads), "vLLM DFlash2")
    return folder
