"""P-EAGLE heads -> the speculators format (``speculators_model_type: peagle``), which vLLM loads.

The EAGLE-3 folder plus the mask token id (top level: vLLM's parallel drafting reads it as its
placeholder token), ``mask_hidden`` (its fc input, so its columns follow fc's layer order) and the
draft's own trained ``embed_tokens`` (vLLM keeps a draft embedding that differs from the target's).
vLLM maps it to ``eagle3`` with ``parallel_drafting`` on, and forwards only some draft options (no
``fc_norm`` or ``norm_output``): draftheads' P-EAGLE uses neither, and the export asserts it.
``norm_before_fc`` is forwarded and exported as for EAGLE-3 (top-level key + ``input_norm.weight``
in fc's column order); vLLM normalises ``mask_hidden`` with it too (methods/peagle/heads.py, ``mask_input``).
"""
from __future__ import annotations

from ...export.common import EngineFolder, ExportError, check_tensors
from ...export.layouts import fc_column_order
from ..eagle3.export import FORMAT, eagle3_folder, expected_eagle3


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
    folder = eagle3_folder(heads, verifier=verifier, verifier_cfg=verifier_cfg, num_speculative_tokens=steps)
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
