"""EAGLE-3: EAGLE's draft layer on several fused target layers with its own draft vocabulary,
trained by training-time test; drafts EAGLE-2's dynamic tree (Li et al., 2025)."""
from ..export import sglang, speculators
from ..export.formats import IMPORT_FORMATS
from ..export.import_eagle import read_eagle3
from ..heads.eagle import Eagle3Head
from ..inference.proposers.eagle import eagle_proposer
from ..registry import EngineLayout, ImportLayout, Method, TreeKind, register
from ..train.eagle_loss import EagleLoss

METHOD = register(Method(
    name="eagle3",
    title="EAGLE-3",
    summary="a draft layer on fused target layers, its own vocabulary; EAGLE-2's dynamic tree",
    heads=Eagle3Head,
    loss=EagleLoss,
    drafter=eagle_proposer,
    tree=TreeKind.DYNAMIC,
    exports={"vllm": EngineLayout("eagle3", speculators.export),  # vLLM loads the speculators layout
             "sglang": EngineLayout("EAGLE3", sglang.export_eagle3),
             "speculators": EngineLayout("eagle3", speculators.export)},
    imports={"eagle3": ImportLayout(IMPORT_FORMATS["eagle3"], read_eagle3),
             "speculators": ImportLayout(IMPORT_FORMATS["speculators"], read_eagle3)},
))
