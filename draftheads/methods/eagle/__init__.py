"""EAGLE-1/2: one draft decoder layer fed the target's feature and the next token, unrolled on its
own outputs; drafts EAGLE-2's dynamic tree grown from its confidences (Li et al., 2024)."""
from .export import export_sglang, export_vllm
from .imports import draft_layer_widths, read_eagle
from .heads import EagleHead
from .drafter import eagle_drafter
from .confidence import measure_confidence
from ...registry import EngineLayout, ImportLayout, Method, TreeKind, register
from .loss import EagleLoss


def _is_eagle1(source) -> bool:
    """fc + Llama layers whose first attention reads the fused state alone (H wide, not EAGLE-3's 2H)."""
    widths = draft_layer_widths(source)
    return widths is not None and widths[1] != 2 * widths[0]


METHOD = register(Method(
    name="eagle",
    title="EAGLE-1/2",
    summary="a draft layer on the last hidden state, unrolled; EAGLE-2's dynamic tree",
    heads=EagleHead,
    loss=EagleLoss,
    drafter=eagle_drafter,
    tree=TreeKind.DYNAMIC,
    confidence=measure_confidence,
    exports={"vllm": EngineLayout("eagle", export_vllm), "sglang": EngineLayout("EAGLE", export_sglang)},
    imports={"eagle": ImportLayout(
        detect=_is_eagle1, read=read_eagle, rank=2, config_names=("eagle",),
        description="EAGLE-1/2 (SafeAILab, vLLM, SGLang): fc.weight [H, 2H] + layers.{i}.self_attn/mlp.*")},
))
