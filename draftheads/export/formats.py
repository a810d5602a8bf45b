"""Names of the formats and which head types each holds (no heavy imports: the command line lists
them before torch loads).

`ENGINE_LAYOUTS` is the one table of "which engine serves which heads, under which name": the
exporters' refusals, the model card's serving snippets and the importers' help all read it, and
tests/test_export_formats_table.py checks that every exporter's dispatch agrees with it.
"""

EXPORT_FORMATS = ("vllm", "sglang", "speculators")

# head type -> {export format: the name the engine gives that draft (vLLM's method, SGLang's
# --speculative-algorithm, speculators' speculators_model_type)}
ENGINE_LAYOUTS = {
    "medusa": {"vllm": "medusa"},
    "eagle": {"vllm": "eagle", "sglang": "EAGLE"},
    "eagle3": {"vllm": "eagle3", "sglang": "EAGLE3", "speculators": "eagle3"},
    "peagle": {"vllm": "eagle3", "speculators": "peagle"},  # vLLM: EAGLE-3 with parallel_drafting
    "dflash": {"vllm": "dflash"},
}
SERVING_ENGINES = ("vllm", "sglang")  # the formats an engine serves directly (speculators is a checkpoint format)


def formats_for(head_type: str) -> tuple[str, ...]:
    """The export formats that hold ``head_type`` heads, in EXPORT_FORMATS order."""
    held = ENGINE_LAYOUTS.get(head_type, {})
    return tuple(f for f in EXPORT_FORMATS if f in held)


def layouts_sentence() -> str:
    """'medusa (vllm), eagle (vllm, sglang), ...': what an exporter's refusal lists."""
    return ", ".join(f"{kind} ({', '.join(formats_for(kind))})" for kind in ENGINE_LAYOUTS)


IMPORT_FORMATS = {
    "medusa": "FasterDecoding Medusa v1/v2: {h}.{l}.linear.weight/bias + {h}.{L}.weight (medusa_lm_head.*)",
    "vllm-medusa": "vLLM Medusa: blocks.{h}.layers.{l}.weight + lm_heads.{h}.weight, config model_type medusa",
    "eagle": "EAGLE-1/2 (SafeAILab, vLLM, SGLang): fc.weight [H, 2H] + layers.{i}.self_attn/mlp.*",
    "eagle3": "EAGLE-3 (SafeAILab, SpecForge, SGLang): midlayer.* + fc + norm + lm_head + d2t/t2d; "
              "aux ids in SGLang's numbering",
    "speculators": "speculators EAGLE-3 / P-EAGLE: config speculators_model_type eagle3 or peagle, layers.0.* + "
                   "d2t/t2d (peagle: + mask_hidden, mask_token_id, embed_tokens); aux ids in vLLM's numbering",
    "dflash": "DFlash (z-lab, SpecForge): config DFlashDraftModel + dflash_config {mask_token_id, target_layer_ids}, "
              "layers.{i}.* with q/k norms + fc + hidden_norm + norm",
    "speculators-dflash": "speculators DFlash: config speculators_model_type dflash, aux_hidden_state_layer_ids, "
                          "mask_token_id, transformer_layer_config",
}
