"""EAGLE-3: EAGLE's draft layer on several fused target layers with its own draft vocabulary,
trained by training-time test; drafts EAGLE-2's dynamic tree (Li et al., 2025)."""
from ..eagle.imports import draft_layer_widths
from .export import export_sglang, export_speculators
from .imports import read_eagle3
from .heads import Eagle3Head
from ..eagle.drafter import eagle_drafter
from ..eagle.confidence import measure_confidence
from ...registry import EngineLayout, ImportLayout, Method, TreeKind, register
from ..eagle.loss import EagleLoss


def _is_eagle3(source) -> bool:
    """SafeAILab / SpecForge / SGLang's layout: midlayer.* or a d2t table, or a first layer attending
    over [embedding, fused] (2H wide)."""
    bare = {k[len("model."):] if k.startswith("model.") else k for k in source.tensors}
    if any(k.startswith("midlayer.") for k in bare) or "d2t" in bare:
        return True
    widths = draft_layer_widths(source)
    return widths is not None and widths[1] == 2 * widths[0]


METHOD = register(Method(
    name="eagle3",
    title="EAGLE-3",
    summary="a draft layer on fused target layers, its own vocabulary; EAGLE-2's dynamic tree",
    heads=Eagle3Head,
    loss=EagleLoss,
    drafter=eagle_drafter,
    tree=TreeKind.DYNAMIC,
    confidence=measure_confidence,
    exports={"vllm": EngineLayout("eagle3", export_speculators, serves_alone=True),  # vLLM loads the speculators layout
             "sglang": EngineLayout("EAGLE3", export_sglang),
             "speculators": EngineLayout("eagle3", export_speculators, serves_alone=True)},
    imports={
        "eagle3": ImportLayout(
            detect=_is_eagle3, read=lambda source, target: read_eagle3(source, target, "eagle3"),
            description="EAGLE-3 (SafeAILab, SpecForge, SGLang): midlayer.* + fc + norm + lm_head + d2t/t2d; aux ids in "
                        "SGLang's numbering",
            config_names=("eagle",)),
        "speculators": ImportLayout(
            detect=lambda source: source.config.get("speculators_model_type") == "eagle3",
            read=lambda source, target: read_eagle3(source, target, "speculators"), rank=0,
            description="speculators EAGLE-3: config speculators_model_type eagle3, layers.0.* + d2t/t2d; aux ids in "
                        "vLLM's numbering",
            config_names=("speculator", "eagle")),
    },
))
