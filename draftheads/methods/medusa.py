"""Medusa: K heads on the target's last hidden state, head k guessing token t+k+2, drafted as a
static tree of rank paths searched from each head's per-rank acceptance (Cai et al., 2024)."""
from ..export import vllm
from ..export.formats import IMPORT_FORMATS
from ..export.import_medusa import read_medusa
from ..heads.medusa import MedusaHeads
from ..inference.proposers.medusa import MedusaProposer
from ..registry import EngineLayout, ImportLayout, Method, TreeKind, register
from ..train.losses import MedusaLoss

METHOD = register(Method(
    name="medusa",
    title="Medusa",
    summary="K heads on the last hidden state; a static tree of rank paths",
    heads=MedusaHeads,
    loss=MedusaLoss,
    drafter=MedusaProposer,
    tree=TreeKind.STATIC,
    exports={"vllm": EngineLayout("medusa", vllm.export_medusa)},
    imports={"medusa": ImportLayout(IMPORT_FORMATS["medusa"], read_medusa),
             "vllm-medusa": ImportLayout(IMPORT_FORMATS["vllm-medusa"], read_medusa)},
))
