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
}
