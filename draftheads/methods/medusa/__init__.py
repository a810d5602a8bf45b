"""Medusa: K heads on the target's last hidden state, head k guessing token t+k+2, drafted as a
static tree of rank paths searched from each head's per-rank acceptance (Cai et al., 2024)."""
from .export import export_medusa
from .imports import MEDUSA_PREFIXES, WEIGHT_FILES, medusa_layout, read_medusa
from .heads import MedusaHeads
from .drafter import MedusaDrafter
from ...registry import EngineLayout, ImportLayout, Method, TreeKind, register
from .loss import MedusaLoss

METHOD = register(Method(
    name="medusa",
    title="Medusa",
    summary="K heads on the last hidden state; a static tree of rank paths",
    heads=MedusaHeads,
    loss=MedusaLoss,
    drafter=MedusaDrafter,
    tree=TreeKind.STATIC,
    default=True,  # the simplest to train and to serve: what a config without heads.head_type trains
    exports={"vllm": EngineLayout("medusa", export_medusa)},
    imports={
        "medusa": ImportLayout(
            detect=lambda source: medusa_layout(source) == "medusa",
            read=lambda source, target: read_medusa(source, target, "medusa"),
            description="FasterDecoding Medusa v1/v2: {h}.{l}.linear.weight/bias + {h}.{L}.weight (medusa_lm_head.*)",
            weight_files=WEIGHT_FILES, keep_only=MEDUSA_PREFIXES, config_names=("medusa",),
            config_keys=("medusa_num_heads",)),
        "vllm-medusa": ImportLayout(
            detect=lambda source: medusa_layout(source) == "vllm-medusa",
            read=lambda source, target: read_medusa(source, target, "vllm-medusa"),
            description="vLLM Medusa: blocks.{h}.layers.{l}.weight + lm_heads.{h}.weight, config model_type medusa",
            config_names=("medusa",)),
    },
))
