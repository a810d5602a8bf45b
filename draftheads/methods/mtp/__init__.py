"""MTP: the target's own multi-token-prediction layer (DeepSeek-V3, Qwen3.5/3.6, Qwen3-Next, GLM-4.5,
...) as a draft layer: its shipped weights as the start, fine-tuned by EAGLE's unrolled loss, drafting
with EAGLE's drafter (chains, EAGLE-2 trees), exported in the layout vLLM's ``*_mtp`` methods load."""
from .heads import MtpHead
from .builtin import builtin_heads
from .export import export_vllm
from ..eagle.drafter import eagle_drafter
from ..eagle.loss import EagleLoss
from ...registry import EngineLayout, Method, TreeKind, register

METHOD = register(Method(
    name="mtp",
    title="MTP",
    summary="the target's own multi-token-prediction layer (shipped weights, fine-tuned); EAGLE-2's dynamic tree",
    heads=MtpHead,
    loss=EagleLoss,
    drafter=eagle_drafter,
    tree=TreeKind.DYNAMIC,
    exports={"vllm": EngineLayout("mtp", export_vllm)},
    builtin=builtin_heads,
))
