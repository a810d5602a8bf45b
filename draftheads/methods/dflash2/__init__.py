"""DFlash2: DFlash's block drafted in ONE forward, with a grouped dynamic convolution in every
layer (each slot mixes in the slots before it) and a candidate selector that walks each slot's
top-K candidates left to right, scoring each against the token before it."""
from . import export, search
from .imports import NATIVE, SPECULATORS, is_native, read_dflash2
from .heads import DFlash2Heads
from .drafter import DFlash2Drafter
from ...registry import EngineLayout, ImportLayout, Method, OneForwardSearch, TreeKind, register
from .loss import DFlash2Loss


METHOD = register(Method(
    name="dflash2",
    title="DFlash2",
    summary="DFlash with a grouped dynamic convolution per layer and a candidate selector walking the block",
    heads=DFlash2Heads,
    loss=DFlash2Loss,
    drafter=DFlash2Drafter,
    tree=TreeKind.ONE_FORWARD,
    one_forward=OneForwardSearch(draft_seconds=search.draft_seconds, accuracy=search.selector_accuracy_table),
    # vLLM serves DFlash2 as method "dflash": its DFlash2DraftModel architecture picks the speculator
    exports={"vllm": EngineLayout("dflash", export.export, check_engine=export.check_engine)},
    imports={
        SPECULATORS: ImportLayout(
            detect=lambda source: source.config.get("speculators_model_type") == "dflash2",
            read=lambda source, target: read_dflash2(source, target, SPECULATORS), rank=0,
            description="speculators DFlash2: config speculators_model_type dflash2, the DFlash keys + the convolution and selector sizes",
            config_names=("speculator", "dflash2")),
        NATIVE: ImportLayout(
            detect=is_native, read=lambda source, target: read_dflash2(source, target, NATIVE), rank=0,
            description="DFlash2 (z-lab, SpecForge): config DFlash2DraftModel + dflash_config {conv_kernel_size, conv_group_size, selector_rank, selector_top_k}, DFlash's tensors + layers.{i}.{attention,mlp}_conv.* + candidate_selector.*",
            config_names=('dflash2draftmodel', 'dflash2')),
    },
))
