"""P-EAGLE: EAGLE-3's draft layer drafting every depth in ONE forward (mask slots after the root),
trained on COD-sampled depths; a static tree read off that forward's per-depth top-k."""
from . import search
from ..eagle3.imports import read_eagle3
from .export import export_peagle
from .imports import PEagleReading
from .heads import PEagleHead
from .drafter import peagle_drafter
from ...registry import EngineLayout, ImportLayout, Method, OneForwardSearch, TreeKind, register
from .loss import PEagleLoss


METHOD = register(Method(
    name="peagle",
    title="P-EAGLE",
    summary="EAGLE-3's draft layer, every depth in one forward; a static tree off its top-k",
    heads=PEagleHead,
    loss=PEagleLoss,
    drafter=peagle_drafter,
    tree=TreeKind.ONE_FORWARD,
    one_forward=OneForwardSearch(draft_seconds=search.draft_seconds, accuracy=search.accuracy),
    # vLLM serves P-EAGLE as EAGLE-3 with parallel drafting, from the speculators layout
    exports={"vllm": EngineLayout("eagle3", export_peagle, serve_extra={"parallel_drafting": True}),
             "speculators": EngineLayout("peagle", export_peagle)},
    imports={"speculators": ImportLayout(
        detect=lambda source: source.config.get("speculators_model_type") == "peagle",
        read=lambda source, target: read_eagle3(source, target, "speculators", PEagleReading()), rank=0,
        description="speculators P-EAGLE: config speculators_model_type peagle, layers.0.* + d2t/t2d + mask_hidden, "
                    "mask_token_id, embed_tokens; aux ids in vLLM's numbering",
        config_names=("speculator", "eagle"))},
))
