"""DFlash: a block of mask slots after the last accepted token, drafted in ONE forward of a small
decoder reading fused target layers as context; trained on random blocks per row."""
from . import export, search, transformers_layout
from .imports import read_dflash
from .heads import DFlashHeads
from .drafter import DFlashDrafter
from ...registry import EngineLayout, ImportLayout, Method, OneForwardSearch, TreeKind, register
from .loss import DFlashLoss


def _is_zlab(source) -> bool:
    """z-lab / SpecForge's layout: a dflash_config, or a DFlash architecture (not a family built
    on it: DFlash2's ``DFlash2DraftModel``, DSpark's ``Qwen3DSparkModel`` read as theirs)."""
    cfg = source.config
    archs = [str(a) for a in cfg.get("architectures") or []]
    if any(a in ("DFlash2DraftModel", "Qwen3DSparkModel") for a in archs):
        return False
    return "dflash_config" in cfg or any(a.startswith("DFlash") for a in archs)


METHOD = register(Method(
    name="dflash",
    title="DFlash",
    summary="a block of mask slots drafted in one forward over fused target layers",
    heads=DFlashHeads,
    loss=DFlashLoss,
    drafter=DFlashDrafter,
    tree=TreeKind.ONE_FORWARD,
    one_forward=OneForwardSearch(draft_seconds=search.draft_seconds, accuracy=search.block_accuracy_table,
                                 ranks_draft_vocab=True),
    exports={"vllm": EngineLayout("dflash", export.export),
             "transformers": EngineLayout("dflash", transformers_layout.export)},  # speculation_type="dflash"
    imports={
        "speculators-dflash": ImportLayout(
            detect=lambda source: source.config.get("speculators_model_type") == "dflash",
            read=lambda source, target: read_dflash(source, target, "speculators-dflash"), rank=0,
            description="speculators DFlash: config speculators_model_type dflash, aux_hidden_state_layer_ids, "
                        "mask_token_id, transformer_layer_config",
            config_names=("speculator", "dflash")),
        "dflash": ImportLayout(
            detect=_is_zlab, read=lambda source, target: read_dflash(source, target, "dflash"), rank=0,
            description="DFlash (z-lab, SpecForge): config DFlashDraftModel + dflash_config {mask_token_id, "
                        "target_layer_ids}, layers.{i}.* with q/k norms + fc + hidden_norm + norm",
            config_names=("dflash",)),
        "transformers": ImportLayout(
            detect=transformers_layout.is_transformers_dflash, read=transformers_layout.read_transformers, rank=0,
            description="transformers' DFlash drafter: config model_type muse_glimmer_assistant (MuseGlimmerAssistantModel) "
                        "with block_size, mask_token_id, target_layer_ids; encoder.fc + encoder.output_norm_enc, layers.{i}.*, norm",
            config_names=("muse_glimmer_assistant", "museglimmerassistant")),
    },
))
