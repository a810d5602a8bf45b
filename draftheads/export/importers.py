"""`import_heads`: a public draft checkpoint -> a draftheads heads folder, checked against the target.

The layout is detected from tensor names and config keys (or forced with ``format``); see
`IMPORT_FORMATS` for what is recognised.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..registry import ImportLayout, Method, methods
from .formats import IMPORT_FORMATS
from .sources import Source, read_source


def import_layouts() -> list[tuple[str, Method, ImportLayout]]:
    """(format, method, layout) of every layout a method imports, in detection order."""
    found = [(fmt, m, layout) for m in methods() for fmt, layout in m.imports.items()]
    return sorted(found, key=lambda entry: entry[2].rank)


def detect_format(source: Source) -> str:
    """The import format of ``source``: the first layout (in `import_layouts` order) that claims it."""
    return _detected(source)[0]


def _detected(source: Source) -> tuple[str, Method, ImportLayout]:
    # A speculators checkpoint says what it is (speculators_model_type): only a layout that a config
    # key names (rank 0) may claim it, never one guessing from its tensors.
    named = source.config.get("speculators_model_type") is not None
    for entry in import_layouts():
        if (entry[2].rank == 0 or not named) and entry[2].detect(source):
            return entry
    looked_for = "\n  - ".join(f"{k}: {v}" for k, v in IMPORT_FORMATS.items())
    sample = ", ".join(sorted(source.tensors)[:6])
    kind = source.config.get("speculators_model_type")
    what = f"speculators_model_type {kind!r} is no layout draftheads imports" if kind is not None else "layout not recognised"
    raise ValueError(f"{source.describe()}: {what} (tensors: {sample} ...). Looked for:\n  - {looked_for}")


def read_heads(src: str | os.PathLike, target: torch.nn.Module, format: str | None = None) -> torch.nn.Module:
    """The checkpoint at ``src`` as draftheads heads bound to ``target`` (nothing written).
    ``format``: skip detection (when several methods read that format, the one that claims the
    checkpoint reads it, else the first)."""
    if format is not None and format not in IMPORT_FORMATS:
        raise ValueError(f"unknown import format {format!r}; valid: {', '.join(IMPORT_FORMATS)}")
    source = read_source(src)
    if format is None:
        _, _, layout = _detected(source)
    else:
        readers = [entry[2] for entry in import_layouts() if entry[0] == format]
        layout = next((r for r in readers if r.detect(source)), readers[0])
    heads = layout.read(source, target)
    heads.bind_target(target)
    ref = target.get_output_embeddings().weight
    return heads.to(device=ref.device).eval()


def import_heads(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    target: torch.nn.Module,
    *,
    format: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert the checkpoint at ``src`` into a draftheads heads folder at ``out_dir`` (atomic;
    refused if it exists unless ``overwrite``)."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass overwrite=True (--overwrite) to replace it")
    heads = read_heads(src, target, format)
    return heads.save_pretrained(out)
