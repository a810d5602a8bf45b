"""EAGLE-3 and P-EAGLE heads -> the speculators format (vllm-project/speculators), which vLLM loads directly.

vLLM reads it through vllm/transformers_utils/configs/speculators/{base,algos}.py: the draft layer's
config is ``transformer_layer_config``; ``norm_before_residual`` defaults to TRUE there (draftheads'
EAGLE-3 keeps the un-normed fused state on the residual stream: false), so it is always written.

P-EAGLE (``speculators_model_type: peagle``) is the EAGLE-3 folder plus the mask token id (top
level: vLLM's parallel drafting reads it as its placeholder token), ``mask_hidden`` (its fc
input, so its columns follow fc's layer order) and the draft's own trained ``embed_tokens``
(vLLM keeps a draft embedding that differs from the target's). vLLM maps it to ``eagle3`` with
``parallel_drafting`` on, and forwards only some draft options (no ``fc_norm`` or
``norm_output``): draftheads' P-EAGLE uses neither, and the export asserts it. ``norm_before_fc``
is forwarded and exported as for EAGLE-3 (top-level key + ``input_norm.weight`` in fc's column
order); vLLM normalises ``mask_hidden`` with it too (heads/peagle.py, ``mask_input``).
"""
from __future__ import annotations

import torch

from .common import EngineFolder, ExportError, check_tensors, dtype_name, llama_layer_config
from .eagle_layers import engine_layer_tensors
from .layouts import d2t_offsets, eagle3_shapes, fc_column_order, t2d_mask, vllm_aux_ids

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


def export_eagle3(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    """EAGLE-3 heads as a speculators folder."""
    heads.check_vocab_mapping()
    return _eagle3_folder(heads, verifier=verifier, verifier_cfg=verifier_cfg,
                          num_speculative_tokens=num_speculative_tokens)


def _eagle3_folder(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
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
        # EAGLE 3.1 (heads/eagle.py): top-level keys, which vLLM's update_eagle3 copies onto the draft config
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


# vLLM's speculators P-EAGLE mapping forwards only these draft options; one set otherwise would
# be dropped without a word (vllm/transformers_utils/configs/speculators/algos.py).
PEAGLE_UNFORWARDED = ("fc_norm", "norm_output")


def export_peagle(heads, *, verifier: str | None, verifier_cfg: dict, num_speculative_tokens: int | None) -> EngineFolder:
    """P-EAGLE heads: the EAGLE-3 folder + mask token id, mask_hidden and the trained embedding."""
    heads.check_vocab_mapping()
    cfg, ex = heads.config, heads.config.extra
    depths = cfg.num_heads
    steps = int(num_speculative_tokens or depths)
    if steps > depths:
        raise ExportError(
            f"num_speculative_tokens {steps} exceeds the {depths} depths these P-EAGLE heads were trained for: vLLM "
            f"would draft mask slots the draft never learned; pass --num-speculative-tokens 1..{depths}"
        )
    folder = _eagle3_folder(heads, verifier=verifier, verifier_cfg=verifier_cfg, num_speculative_tokens=steps)
    config = folder.config
    set_options = [k for k in PEAGLE_UNFORWARDED if config.get(k)]
    if set_options:
        raise ExportError(f"vLLM's P-EAGLE loader does not forward {', '.join(set_options)}: it would compute another draft")
    for key in PEAGLE_UNFORWARDED:  # false, and not forwarded anyway: leave them out rather than suggest they count
        config.pop(key, None)
    config["architectures"] = ["PEagleSpeculator"]
    config["speculators_model_type"] = "peagle"
    config["speculators_config"]["algorithm"] = "peagle"
    config["mask_token_id"] = int(ex["mask_token_id"])
    config["embed_requires_grad"] = True
    state = heads.state_dict()
    order = fc_column_order(ex["feature_layers"], cfg.hidden_size)
    folder.tensors["mask_hidden"] = state["mask_hidden"].detach().cpu().reshape(1, 1, -1)[..., order].contiguous()
    folder.tensors["embed_tokens.weight"] = state["embed_tokens.weight"].detach().cpu()
    folder.notes.append(f"P-EAGLE: mask token {ex['mask_token_id']}, trained {depths} depths; "
                        f"launch with speculative_config={{'model': DIR, 'method': 'eagle3', 'parallel_drafting': True, "
                        f"'num_speculative_tokens': {steps}}} or LLM(model=DIR)")
    shapes = expected_eagle3(heads, "layers.0", "input_layernorm")
    shapes["mask_hidden"] = (1, 1, cfg.hidden_size * len(ex["feature_layers"]))
    shapes["embed_tokens.weight"] = (cfg.vocab_size, cfg.hidden_size)
    check_tensors(folder, shapes, FORMAT)
    return folder
