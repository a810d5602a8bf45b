"""EAGLE-1/2: one draft decoder layer fed the target's feature and the next token, unrolled on its
own outputs; drafts EAGLE-2's dynamic tree grown from its confidences (Li et al., 2024)."""
from ..export import sglang, vllm
from ..export.formats import IMPORT_FORMATS
from ..export.import_eagle import read_eagle
from ..heads.eagle import EagleHead
from ..inference.proposers.eagle import eagle_proposer
from ..registry import EngineLayout, ImportLayout, Method, TreeKind, register
from ..train.eagle_loss import EagleLoss

METHOD = register(Method(
    name="eagle",
    title="EAGLE-1/2",
    summary="a draft layer on the last hidden state, unrolled; EAGLE-2's dynamic tree",
    heads=EagleHead,
    loss=EagleLoss,
    drafter=eagle_proposer,
    tree=TreeKind.DYNAMIC,
    exports={"vllm": EngineLayout("eagle", vllm.export_eagle), "sglang": EngineLayout("EAGLE", sglang.export_eagle)},
    imports={"eagle": ImportLayout(IMPORT_FORMATS["eagle"], lambda source, target, layout: read_eagle(source, target))},
))
