"""DFlash: a block of mask slots after the last accepted token, drafted in ONE forward of a small
decoder reading fused target layers as context; trained on random blocks per row."""
from . import export
from .imports import read_dflash
from ...heads.dflash import DFlashHeads
from ...inference.proposers.dflash import block_accuracy_table, dflash_proposer, measure_block_seconds
from ...registry import EngineLayout, ImportLayout, Method, OneForwardSearch, TreeKind, register
from .loss import DFlashLoss


def _is_zlab(source) -> bool:
    """z-lab / SpecForge's layout: a dflash_config, or a DFlash architecture."""
    cfg = source.config
    return "dflash_config" in cfg or any(str(a).startswith("DFlash") for a in cfg.get("architectures") or [])


def _draft_seconds(heads, draft_vocab_size=None) -> dict[int, float]:
    """DFlash runs its whole block whatever the tree: one cost for every depth (0: plain)."""
    block = measure_block_seconds(heads, draft_vocab_size=draft_vocab_size)
    return {0: 0.0, **{d: block for d in range(1, heads.config.num_heads + 1)}}


def _accuracy(target, heads, sequences, max_rank, skip_prompt=None, draft_vocab_size=None):
    return block_accuracy_table(target, heads, sequences, max_rank, skip_prompt=skip_prompt,
                                draft_vocab_size=draft_vocab_size)


METHOD = register(Method(
    name="dflash",
    title="DFlash",
    summary="a block of mask slots drafted in one forward over fused target layers",
    heads=DFlashHeads,
    loss=DFlashLoss,
    drafter=dflash_proposer,
    tree=TreeKind.ONE_FORWARD,
    one_forward=OneForwardSearch(draft_seconds=_draft_seconds, accuracy=_accuracy, ranks_draft_vocab=True),
    exports={"vllm": EngineLayout("dflash", export.export)},
    imports={
        "speculators-dflash": ImportLayout(
            detect=lambda source: source.config.get("speculators_model_type") == "dflash",
            read=lambda source, target: read_dflash(source, target, "speculators-dflash"), rank=0),
        "dflash": ImportLayout(detect=_is_zlab, read=lambda source, target: read_dflash(source, target, "dflash"),
                               rank=0),
    },
))
