"""Names of the formats (no heavy imports: the command line lists them before torch loads), and
which heads each holds.

Which engine holds which heads, under which name, is declared by each method
(`registry.Method.exports`, in draftheads/methods/): `engine_layouts` gathers it into the one
table that the exporter's refusals and the model card's serving snippets read.
"""
from ..registry import UnknownMethodError, method_named, methods

EXPORT_FORMATS = ("vllm", "sglang", "speculators")
ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "speculators": "speculators"}
SERVING_ENGINES = ("vllm", "sglang")  # the formats an engine serves directly (speculators is a checkpoint format)


def engine_layouts() -> dict[str, dict[str, str]]:
    """head type -> {export format: the name the engine gives that draft (vLLM's method, SGLang's
    --speculative-algorithm, speculators' speculators_model_type)}, for every method an engine holds."""
    return {m.name: {f: m.exports[f].engine_name for f in EXPORT_FORMATS if f in m.exports} for m in methods() if m.exports}


def formats_for(head_type: str) -> tuple[str, ...]:
    """The export formats that hold ``head_type`` heads, in EXPORT_FORMATS order (none for a head
    type no method has)."""
    try:
        held = method_named(head_type).exports
    except UnknownMethodError:
        return ()
    return tuple(f for f in EXPORT_FORMATS if f in held)


def layouts_sentence() -> str:
    """'medusa (vllm), eagle (vllm, sglang), ...': what an exporter's refusal lists."""
    return ", ".join(f"{kind} ({', '.join(held)})" for kind, held in engine_layouts().items())


# The public layouts `draftheads import` reads, and how each is recognised. Which method's heads a
# layout becomes is declared by the methods (`registry.Method.imports`).
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
    "dspark": "DSpark, vLLM's dense Qwen3DSparkModel (DeepSpec): DFlash's tensors + markov_head.markov_w1/w2 "
              "(+ confidence_head.proj), config target_layer_ids, mask_token_id, markov_rank, block_size",
    "speculators-dspark": "speculators DSpark: config speculators_model_type dspark, aux_hidden_state_layer_ids, "
                          "markov_rank, transformer_layer_config",
    "dflash2": "DFlash2 (z-lab, SpecForge): config DFlash2DraftModel + dflash_config {conv_kernel_size, conv_group_size, "
               "selector_rank, selector_top_k}, DFlash's tensors + layers.{i}.{attention,mlp}_conv.* + candidate_selector.*",
    "speculators-dflash2": "speculators DFlash2: config speculators_model_type dflash2, the DFlash keys + the "
                           "convolution and selector sizes",
}
