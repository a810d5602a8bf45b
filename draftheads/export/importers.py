"""`import_heads`: a public draft checkpoint -> a draftheads heads folder, checked against the target.

The layout is detected from tensor names and config keys (or forced with ``format``); see
`formats.import_formats` for what is recognised (each method declares its layouts).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..registry import ImportLayout, Method, methods
from .formats import import_formats
from ..heads.folder import save_heads
from .common import IMPORT_METADATA, check_output_folder, read_token_counts
from .sources import Source, read_source
from .verifier_check import check_recorded_verifier


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
    looked_for = "\n  - ".join(f"{k}: {v}" for k, v in import_formats().items())
    sample = ", ".join(sorted(source.tensors)[:6])
    kind = source.config.get("speculators_model_type")
    what = f"speculators_model_type {kind!r} is no layout draftheads imports" if kind is not None else "layout not recognised"
    raise ValueError(f"{source.describe()}: {what} (tensors: {sample} ...). Looked for:\n  - {looked_for}")


def check_import_format(format: str | None) -> None:
    """Refuse an import format no method reads (None: detect it), listing the ones there are."""
    known = import_formats()
    if format is not None and format not in known:
        raise ValueError(f"unknown import format {format!r}; valid: {', '.join(known)}")


def read_heads(src: str | os.PathLike, target: torch.nn.Module, format: str | None = None) -> torch.nn.Module:
    """The checkpoint at ``src`` as draftheads heads bound to ``target`` (nothing written).
    ``format``: skip detection (when several methods read that format, the one that claims the
    checkpoint reads it, else the first)."""
    return _read(src, target, format)[0]


def _read(src: str | os.PathLike, target: torch.nn.Module, format: str | None) -> tuple[torch.nn.Module, str, Source]:
    """(heads, the import format read, the source)."""
    check_import_format(format)
    layouts = [entry[2] for entry in import_layouts()]
    source = read_source(src, weight_names=tuple(dict.fromkeys(n for layout in layouts for n in layout.weight_files)),
                         keep_only=tuple(dict.fromkeys(p for layout in layouts for p in layout.keep_only)))
    if format is None:
        format, _, layout = _detected(source)
    else:
        readers = [entry[2] for entry in import_layouts() if entry[0] == format]
        layout = next((r for r in readers if r.detect(source)), readers[0])
    heads = layout.read(source, target)
    counts = read_token_counts(source.path, int(heads.token_counts.numel()))  # a draftheads export kept them
    if counts is not None:
        with torch.no_grad():
            heads.token_counts.copy_(counts)
    heads.bind_target(target)
    ref = target.get_output_embeddings().weight
    return heads.to(device=ref.device).eval(), format, source


def import_heads(
    src: str | os.PathLike,
    out_dir: str | os.PathLike,
    target: torch.nn.Module,
    *,
    format: str | None = None,
    overwrite: bool = False,
    target_name: str | None = None,
    allow_other_verifier: bool = False,
) -> Path:
    """Convert the checkpoint at ``src`` into a draftheads heads folder at ``out_dir`` (atomic;
    refused if it exists unless ``overwrite``, and then only over an earlier import or export: see
    `check_output_folder`). The folder records what it was converted from (`IMPORT_METADATA`).

    A checkpoint that names its verifier is imported only for that model (``target_name``: what
    the user called ``target``, default its ``name_or_path``; see export/verifier_check.py) unless
    ``allow_other_verifier``."""
    out = Path(out_dir)
    check_output_folder(out, src, overwrite)
    heads, layout, source = _read(src, target, format)
    check_recorded_verifier(source, target, target_name, allow_other_verifier)
    provenance = {"source": str(Path(src).absolute()), "format": layout}
    return save_heads(heads, out, extra_files={IMPORT_METADATA: json.dumps(provenance, indent=2) + "\n"})
