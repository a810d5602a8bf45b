"""Names of the formats (no heavy imports: the command line lists them before torch loads), and
which heads each holds.

Which engine holds which heads, under which name, is declared by each method
(`registry.Method.exports`, in draftheads/methods/): `engine_layouts` gathers it into the one
table that the exporter's refusals and the model card's serving snippets read.
"""
from ..registry import UnknownMethodError, method_named, methods

EXPORT_FORMATS = ("vllm", "sglang", "speculators", "transformers")
ENGINE_TITLES = {"vllm": "vLLM", "sglang": "SGLang", "speculators": "speculators", "transformers": "transformers"}
SERVING_ENGINES = ("vllm", "sglang")  # the formats an engine serves directly (speculators is a checkpoint format)


def engine_layouts() -> dict[str, dict[str, str]]:
    """head type -> {export format: the name the engine gives that draft (vLLM's method, SGLang's
    --speculative-algorithm, speculators' speculators_model_type, transformers' speculation_type)}, for every method an engine holds."""
    return {m.name: {f: m.exports[f].engine_name for f in EXPORT_FORMATS if f in m.exports} for m in methods() if m.exports}


def formats_for(head_type: str) -> tuple[str, ...]:
    """The export formats that hold ``head_type`` heads, in EXPORT_FORMATS order (none for a head
    type no method has)."""
    try:
        held = method_named(head_type).exports
    except UnknownMethodError:
        return ()
    return tuple(f for f in EXPORT_FORMATS if f in held)


def layouts_sentence() -> str:
    """'medusa (vllm), eagle (vllm, sglang), ...': what an exporter's refusal lists."""
    return ", ".join(f"{kind} ({', '.join(held)})" for kind, held in engine_layouts().items())


def import_formats() -> dict[str, str]:
    """import format -> what the layout is and how it is recognised: every public layout
    ``draftheads import`` reads, as the methods declare them (`registry.ImportLayout`), in
    registration order. A format several methods read (speculators: EAGLE-3 and P-EAGLE) lists each
    method's description."""
    described: dict[str, list[str]] = {}
    for method in methods():
        for name, layout in method.imports.items():
            described.setdefault(name, []).append(layout.description)
    return {name: "; ".join(dict.fromkeys(d for d in texts if d)) for name, texts in described.items()}


def __getattr__(name: str):
    """``IMPORT_FORMATS``: `import_formats`, read on first use (the methods declare the layouts, and
    registering them loads torch, which listing the export formats must not)."""
    if name == "IMPORT_FORMATS":
        return import_formats()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
