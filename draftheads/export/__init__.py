"""Engine formats: export draftheads heads to vLLM / SGLang / speculators, import public checkpoints.

    from draftheads.export import export_heads, import_heads
    export_heads("runs/demo/heads", "out/vllm-medusa", "vllm")
    import_heads("path/to/EAGLE3-checkpoint", "runs/imported", target)

One module per engine layout (vllm, sglang, speculators; importers); the tensor names and shapes
of every layout are described once in `layouts`.
"""
from .common import ExportError
from .exporter import FORMATS, export_heads

__all__ = ["ExportError", "FORMATS", "export_heads", "import_heads", "IMPORT_FORMATS"]


def __getattr__(name):  # the importers pull in more (torch.load for .bin files): load on first use
    if name in ("import_heads", "IMPORT_FORMATS"):
        from . import importers

        return getattr(importers, name)
    raise AttributeError(name)
