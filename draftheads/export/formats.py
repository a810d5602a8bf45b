"""Names of the formats (no heavy imports: the command line lists them before torch loads)."""

EXPORT_FORMATS = ("vllm", "sglang", "speculators")

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
