"""`import_heads`: a public draft checkpoint -> a draftheads heads folder, checked against the target.

The layout is detected from tensor names and config keys (or forced with ``format``); see
`IMPORT_FORMATS` for what is recognised.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from .import_dflash import read_dflash
from .import_eagle import read_eagle, read_eagle3
from .import_medusa import ORIGINAL_BLOCK, VLLM_BLOCK, read_medusa, strip_prefix
from .formats import IMPORT_FORMATS
from ..heads.folder import save_heads
from .common import IMPORT_METADATA, check_output_folder, read_token_counts
from .sources import Source, read_source
from .verifier_check import check_recorded_verifier



def detect_format(source: Source) -> str:
    names = {strip_prefix(k) for k in source.tensors}
    bare = {k[len("model."):] if k.startswith("model.") else k for k in names}
    cfg = source.config
    if cfg.get("speculators_model_type") is not None:
        if cfg["speculators_model_type"] == "dflash":
            return "speculators-dflash"
        if cfg["speculators_model_type"] not in ("eagle3", "peagle"):
            raise ValueError(f"{source.path}: speculators_model_type {cfg['speculators_model_type']!r}: only eagle3, "
                             "peagle and dflash import")
        return "speculators"
    if "dflash_config" in cfg or any(str(a).startswith("DFlash") for a in cfg.get("architectures") or []):
        return "dflash"
    if any(VLLM_BLOCK.match(k) for k in names):
        return "vllm-medusa"
    if any(ORIGINAL_BLOCK.match(k) for k in names):
        return "medusa"
    if any(k.startswith("midlayer.") for k in bare) or "d2t" in bare:
        return "eagle3"
    fc = next((source.tensors[k] for k in source.tensors if re.fullmatch(r"(model\.)?fc\.weight", k)), None)
    if fc is not None and any(k.startswith("layers.0.self_attn.") for k in bare):
        q = next(source.tensors[k] for k in source.tensors if k.endswith("layers.0.self_attn.q_proj.weight"))
        # EAGLE-3's first layer attends over [embedding, fused] (2H); EAGLE-1's over the fused state (H).
        return "eagle3" if q.shape[1] == 2 * fc.shape[0] else "eagle"
    looked_for = "\n  - ".join(f"{k}: {v}" for k, v in IMPORT_FORMATS.items())
    sample = ", ".join(sorted(source.tensors)[:6])
    raise ValueError(f"{source.describe()}: layout not recognised (tensors: {sample} ...). Looked for:\n  - {looked_for}")


def read_heads(src: str | os.PathLike, target: torch.nn.Module, format: str | None = None) -> torch.nn.Module:
    """The checkpoint at ``src`` as draftheads heads bound to ``target`` (nothing written)."""
    return _read(src, target, format)[0]


def _read(src: str | os.PathLike, target: torch.nn.Module, format: str | None) -> tuple[torch.nn.Module, str, Source]:
    """(heads, the layout read, the source)."""
    if format is not None and format not in IMPORT_FORMATS:
        raise ValueError(f"unknown import format {format!r}; valid: {', '.join(IMPORT_FORMATS)}")
    source = read_source(src)
    layout = format or detect_format(source)
    if layout in ("medusa", "vllm-medusa"):
        heads = read_medusa(source, target, layout)
    elif layout == "eagle":
        heads = read_eagle(source, target)
    elif layout in ("dflash", "speculators-dflash"):
        heads = read_dflash(source, target, layout)
    else:
        heads = read_eagle3(source, target, layout)
    counts = read_token_counts(source.path, int(heads.token_counts.numel()))  # a draftheads export kept them
    if counts is not None:
        with torch.no_grad():
            heads.token_counts.copy_(counts)
    heads.bind_target(target)
    ref = target.get_output_embeddings().weight
    return heads.to(device=ref.device).eval(), layout, source


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
