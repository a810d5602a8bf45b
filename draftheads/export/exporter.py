"""`export_heads`: a draftheads heads folder -> an engine's folder, written atomically."""
from __future__ import annotations

import os
from pathlib import Path

from ..heads.hub import resolve_heads_folder
from ..heads.io import load_heads
from .card import CARD_NAME, export_card
from . import sglang, speculators, vllm
from .common import ExportError, resolve_verifier, verifier_config, write_engine_folder

FORMATS = {"vllm": vllm.export, "sglang": sglang.export, "speculators": speculators.export}
# (format, head type) of the exports whose folder records the draft tokens per step (speculators'
# proposal_methods); every other engine takes it at serve time, from speculative_config.
WRITES_SPECULATIVE_TOKENS = {("vllm", "eagle3"), ("speculators", "eagle3")}


def check_speculative_tokens(value: int | None, format: str, head_type: str) -> None:
    """Refuse a ``num_speculative_tokens`` the export would not write (rather than ignore it) or
    that no engine accepts (< 1: the heads' default used to be written instead)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExportError(f"num_speculative_tokens must be a whole number >= 1, got {value!r}")
    if (format, head_type) not in WRITES_SPECULATIVE_TOKENS:
        raise ExportError(
            f"num_speculative_tokens: the {format} format for {head_type} heads does not record draft tokens per "
            f"step (only EAGLE-3 heads in the speculators layout, --format vllm or speculators, do); give it to the "
            f"engine when serving: speculative_config={{..., 'num_speculative_tokens': {value}}}"
        )


def check_verifier(verifier: str) -> None:
    """An explicit verifier must be a model folder or a Hub id: the engine opens it only at serve
    time, where a typo would surface far from the export that wrote it."""
    from ..demo import DEMO_TARGET
    from ..target import TargetLoadError, check_target_source

    if verifier == DEMO_TARGET:
        return
    try:
        check_target_source(verifier)
    except TargetLoadError as e:
        raise ExportError(f"--verifier: {e}") from None


def export_heads(
    heads_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    format: str,
    *,
    verifier: str | None = None,
    num_speculative_tokens: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the heads in ``heads_dir`` as ``format`` ("vllm", "sglang", "speculators") to ``out_dir``.

    ``verifier``: the target as the engine should open it (default: the target the heads recorded;
    "demo" is the demo target's cache folder). Refuses, naming the reason, heads the format
    cannot hold exactly, and an existing ``out_dir`` unless ``overwrite``."""
    if format not in FORMATS:
        raise ExportError(f"unknown export format {format!r}; valid: {', '.join(FORMATS)}")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists: pass overwrite=True (--overwrite) to replace it")
    heads = load_heads(heads_dir)
    check_speculative_tokens(num_speculative_tokens, format, heads.config.head_type)
    if verifier is not None:
        check_verifier(verifier)
    resolved = resolve_verifier(heads.config, verifier)
    folder = FORMATS[format](
        heads, verifier=resolved, verifier_cfg=verifier_config(resolved), num_speculative_tokens=num_speculative_tokens
    )
    local = Path(heads_dir).exists()  # else a Hub id, which load_heads resolved: record the id
    metadata = {"format": format, "head_type": heads.config.head_type,
                "heads": str(Path(heads_dir).absolute()) if local else str(heads_dir), "verifier": resolved,
                "num_speculative_tokens": num_speculative_tokens}
    card = export_card(folder.config, {**metadata, "notes": folder.notes}, heads.config.to_dict(), str(out),
                       source_card(heads_dir))
    return write_engine_folder(out, folder, metadata, overwrite, card=card)


def source_card(heads_dir: str | os.PathLike) -> str | None:
    """The heads folder's model card, if it has one (its training figures go into the export's)."""
    card = resolve_heads_folder(heads_dir) / CARD_NAME
    return card.read_text(encoding="utf-8") if card.is_file() else None
