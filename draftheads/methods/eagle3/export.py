"""EAGLE-3 heads -> engine folders.

speculators (vllm-project/speculators), which vLLM loads directly: vLLM reads it through
vllm/transformers_utils/configs/speculators/{base,algos}.py: the draft layer's config is
``transformer_layer_config``; ``norm_before_residual`` defaults to TRUE there (draftheads' EAGLE-3
keeps the un-normed fused state on the residual stream: false), so it is always written.
SGLang: ``LlamaForCausalLMEagle3`` (sglang/srt/models/llama_eagle3.py): layer 0 as ``midlayer.*``;
a later layer's pre-attention norm is its ``hidden_norm``; explicit aux ids count "the output of
layer j" (SGLang adds 1), one less than draftheads' feature layers. SGLang skips unknown tensor
names silently, as vLLM does.
"""
from __future__ import annotations

import torch

from ...export.common import EngineFolder, ExportError, check_tensors, dtype_name, llama_layer_config
from ...export.eagle_layers import engine_layer_tensors
from ...export.layouts import d2t_offsets, fc_column_order, layer_shapes, sglang_aux_ids, t2d_mask, vllm_aux_ids

FORMAT = "speculators"
SPECULATORS_VERSION = "0.3.0"


def eagle3_tensors(heads, layer0_prefix: str, later_norm: str) -> dict[str, torch.Tensor]:
    """EAGLE-3 tensors under engine names: fc columns in layer order, d2t as offsets, t2d a mask."""
    cfg, ex = heads.config, heads.config.extra
    state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    prefixes = [layer0_prefix] + [f"layers.{i}" for i in range(1, cfg.num_layers)]
    out = engine_layer_tensors(state, cfg.num_layers, prefixes, later_norm)
    out[f"{layer0_prefix}.input_layernorm.weight"] = state["embed_norm.weight"]  # the norm on the embedding
    out[f"{layer0_prefix}.hidden_norm.weight"] = state["hidden_norm.weight"]
    columns = fc_column_order(ex["feature_layers"], cfg.hidden_size)
    out["fc.weight"] = state["fc.weight"][:, columns]
    if ex.get("norm_before_fc"):  # one weight per fc input column: it follows fc's columns into layer order
        out["input_norm.weight"] = state["input_norm.weight"][columns].contiguous()
    if ex.get("fc_norm"):  # EAGLE 3.1: engine chunk j = the j-th fused layer in layer order, as fc's columns
        for j, i in enumerate(sorted(range(len(ex["feature_layers"])), key=lambda i: ex["feature_layers"][i])):
            out[f"fc_norm.{j}.weight"] = state[f"fc_norm.{i}.weight"]
    out["norm.weight"] = state["norm.weight"]
    out["lm_head.weight"] = state["lm_head.weight"]
    d2t = state["draft_to_target"]
    if d2t.numel() < cfg.vocab_size:
        out["d2t"] = d2t_offsets(d2t)
        out["t2d"] = t2d_mask(d2t, cfg.vocab_size)
    # Full draft vocabulary: the mapping is the identity (checked at load) and the engines expect none.
    return out


def expected_eagle3(heads, layer0_prefix: str, later_norm: str) -> dict:
    shapes = eagle3_shapes(heads.config, layer0_prefix=layer0_prefix, later_norm=later_norm)
    if heads.config.extra["draft_vocab_size"] >= heads.config.vocab_size:
        shapes.pop("d2t"), shapes.pop("t2d")
    return shapes


def export_speculators(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    """EAGLE-3 heads as a speculators folder."""
    heads.check_vocab_mapping()
    return eagle3_folder(heads, verifier=verifier, verifier_cfg=verifier_cfg,
                          num_speculative_tokens=num_speculative_tokens)


def eagle3_folder(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    cfg, ex = heads.config, heads.config.extra
    if not verifier:
        raise ExportError(
            "the speculators format names its verifier (speculators_config.verifier.name_or_path) and these heads "
            "recorded no target: pass --verifier PATH_OR_ID"
        )
    n_layers_target = cfg.target.num_hidden_layers if cfg.target else int(verifier_cfg.get("num_hidden_layers", 0))
    ids = vllm_aux_ids(ex["feature_layers"], n_layers_target)
    steps = cfg.num_heads if num_speculative_tokens is None else int(num_speculative_tokens)  # 0 is refused, not the default
    if steps < 1:
        raise ExportError(f"num_speculative_tokens must be >= 1, got {steps}")
    tensors = eagle3_tensors(heads, "layers.0", "input_layernorm")
    layer_cfg = llama_layer_config(cfg, verifier_cfg, cfg.num_layers)
    layer_cfg["architectures"] = ["LlamaForCausalLM"]
    # vLLM's draft sizes its fc from these (the top-level ids alone would leave it at 3 inputs).
    layer_cfg["num_aux_hidden_states"] = len(ids)
    layer_cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True}
    architectures = verifier_cfg.get("architectures") or ([cfg.target.architecture] if cfg.target else [])
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer_cfg,
        "draft_vocab_size": ex["draft_vocab_size"],
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": ids,
        "norm_before_residual": False,
        # EAGLE 3.1 (methods/eagle3/heads.py): top-level keys, which vLLM's update_eagle3 copies onto the draft config
        # (norm_before_fc: vLLM's llama_eagle3 reads eagle_config's first, which this export leaves unset)
        "norm_before_fc": bool(ex.get("norm_before_fc", False)),
        "fc_norm": bool(ex.get("fc_norm", False)),
        "norm_output": bool(ex.get("norm_output", False)),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": steps}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": list(architectures)},
        },
        "torch_dtype": dtype_name(tensors),
    }
    folder = EngineFolder(config, tensors, notes=[
        f"aux hidden-state layer ids {ids} (vLLM: residual stream after k layers) from draftheads feature_layers "
        f"{ex['feature_layers']}",
        f"verifier {verifier}; {steps} speculative tokens",
    ])
    check_tensors(folder, expected_eagle3(heads, "layers.0", "input_layernorm"), FORMAT)
    return folder


def export_sglang(heads, *, verifier, verifier_cfg, num_speculative_tokens) -> EngineFolder:
    heads.check_vocab_mapping()
    cfg, ex = heads.config, heads.config.extra
    on = [key for key in ("norm_before_fc", "fc_norm", "norm_output") if ex.get(key)]
    if on:  # not seen in sglang/srt/models/llama_eagle3.py, which skips unknown tensors without a word
        raise ExportError(
            f"{', '.join(on)} (EAGLE 3.1): SGLang's LlamaForCausalLMEagle3 is not known to compute it, and it would "
            "drop input_norm / fc_norm weights silently and serve another draft; export with --format vllm (or "
            "speculators)"
        )
    n_target = cfg.target.num_hidden_layers if cfg.target else int(verifier_cfg.get("num_hidden_layers", 0))
    ids = sglang_aux_ids(ex["feature_layers"], n_target)
    if len(ids) == 1:
        raise ExportError(
            "EAGLE-3 heads fusing a single target layer: SGLang applies fc only when the input is wider than the "
            "hidden size, so it would skip it; export with --format vllm"
        )
    tensors = eagle3_tensors(heads, "midlayer", "hidden_norm")
    config = llama_layer_config(cfg, verifier_cfg, cfg.num_layers)
    config.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": ex["draft_vocab_size"],
        "target_hidden_size": cfg.hidden_size,
        "num_aux_hidden_states": len(ids),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        "norm_before_residual": False,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "bias": False,
        "torch_dtype": dtype_name(tensors),
    })
    folder = EngineFolder(config, tensors, [
        f"SGLang aux ids {ids} (output of layer j) from draftheads feature_layers {ex['feature_layers']} (input of layer f)"
    ])
    check_tensors(folder, expected_eagle3(heads, "midlayer", "hidden_norm"), "SGLang EAGLE-3")
    return folder


def eagle3_shapes(config, *, layer0_prefix: str, later_norm: str = "input_layernorm") -> dict:
    """EAGLE-3 drafts: ``layer0_prefix`` is ``midlayer`` (SGLang / SpecForge / SafeAILab) or
    ``layers.0`` (speculators). Later layers' pre-attention norm is ``input_layernorm`` in vLLM and
    ``hidden_norm`` in SGLang (``later_norm``)."""
    d, ex = config.hidden_size, config.extra
    n_aux = len(ex["feature_layers"])
    vocab, n = config.vocab_size, ex["draft_vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (d, n_aux * d), "norm.weight": (d,), "lm_head.weight": (n, d)}
    for i in range(config.num_layers):
        prefix = layer0_prefix if i == 0 else f"layers.{i}"
        for name, shape in layer_shapes(ex, d, 2 * d if i == 0 else d, input_norm=True).items():
            if i > 0 and name == "input_layernorm.weight":
                name = f"{later_norm}.weight"
            shapes[f"{prefix}.{name}"] = shape
        if i == 0:
            shapes[f"{prefix}.hidden_norm.weight"] = (d,)
    if ex.get("fc_norm"):  # EAGLE 3.1: vLLM's per-layer norms before fc (vllm/model_executor/models/llama_eagle3.py)
        shapes.update({f"fc_norm.{j}.weight": (d,) for j in range(n_aux)})
    if ex.get("norm_before_fc"):  # vLLM's input_norm over the whole fc input (same file)
        shapes["input_norm.weight"] = (n_aux * d,)
    shapes["d2t"] = (n,)
    shapes["t2d"] = (vocab,)
    return shapes
