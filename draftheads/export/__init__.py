"""Engine formats: export draftheads heads to vLLM / SGLang / speculators, import public checkpoints.

    from draftheads.export import export_heads, import_heads
    export_heads("runs/smollm2/heads", "out/vllm-medusa", "vllm")
    import_heads("path/to/EAGLE3-checkpoint", "runs/imported", target)

Each method writes and reads its own layouts (e.g. methods/medusa/export.py and
methods/medusa/imports.py); this package drives them and holds what they share: the tensor names and
shapes of every layout (`layouts`), the engine folder (`common`), the sources read, the model card.
"""
from .formats import EXPORT_FORMATS

__all__ = ["EXPORT_FORMATS", "ExportError", "IMPORT_FORMATS", "export_heads", "import_heads", "read_heads"]


def __getattr__(name):  # torch and the heads load on first use, not when the command line lists formats
    if name in ("export_heads", "FORMATS"):
        from . import exporter

        return getattr(exporter, name)
    if name == "IMPORT_FORMATS":  # the methods declare them (`formats.import_formats`)
        from .formats import import_formats

        return import_formats()
    if name == "ExportError":
        from .common import ExportError

        return ExportError
    if name in ("import_heads", "read_heads"):
        from . import importers

        return getattr(importers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
