"""DFlash: a block of mask slots after the last accepted token, drafted in ONE forward of a small
decoder reading fused target layers as context; trained on random blocks per row."""
from ..export import dflash as dflash_layout
from ..export.formats import IMPORT_FORMATS
from ..export.import_dflash import read_dflash
from ..heads.dflash import DFlashHeads
from ..inference.proposers.dflash import dflash_proposer
from ..registry import EngineLayout, ImportLayout, Method, TreeKind, register
from ..train.dflash_loss import DFlashLoss

METHOD = register(Method(
    name="dflash",
    title="DFlash",
    summary="a block of mask slots drafted in one forward over fused target layers",
    heads=DFlashHeads,
    loss=DFlashLoss,
    drafter=dflash_proposer,
    tree=TreeKind.ONE_FORWARD,
    exports={"vllm": EngineLayout("dflash", dflash_layout.export)},
    imports={"dflash": ImportLayout(IMPORT_FORMATS["dflash"], read_dflash),
             "speculators-dflash": ImportLayout(IMPORT_FORMATS["speculators-dflash"], read_dflash)},
))
