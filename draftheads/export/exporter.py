"""`export_heads`: a draftheads heads folder -> an engine's folder, written atomically."""
from __future__ import annotations

import os
from pathlib import Path

from ..heads.hub import resolve_heads_folder
from ..heads.io import load_heads
from ..registry import EngineLayout, Method, TreeKind, method_of
from .card import CARD_NAME, export_card
from .common import (
    TOKEN_COUNTS_NAME,
    ExportError,
    check_output_folder,
    resolve_verifier,
    token_counts_json,
    verifier_config,
    write_engine_folder,
)
from .formats import ENGINE_TITLES, EXPORT_FORMATS, layouts_sentence


def check_speculative_tokens(value: int | None, heads) -> None:
    """Refuse a ``num_speculative_tokens`` no engine accepts (< 1: the heads' default used to be
    written instead) or more than these heads draft per step. Every export records the value (its
    metadata and the model card's ``speculative_config``); layouts with a slot for it (speculators
    EAGLE-3 / P-EAGLE, DFlash's block check) also write or check it in the engine config."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExportError(f"num_speculative_tokens must be a whole number >= 1, got {value!r}")
    kind, most = heads.config.head_type, heads.config.num_heads
    if method_of(heads).tree is TreeKind.STATIC and value > most:  # one head per depth
        raise ExportError(
            f"num_speculative_tokens {value}: these {kind} heads draft at most {most} tokens per step "
            f"(one per head); export with --num-speculative-tokens {most} or fewer"
        )


def check_no_sliding_window(heads, format: str) -> None:
    """Refuse heads whose draft layer attends through a sliding window (``extra.sliding_window``).

    No export writes the window today, and an engine reading the config without one would attend
    to the whole context: another draft than the one measured. (vLLM's Llama EAGLE-3 draft reads
    ``layer_types`` + ``sliding_window`` from its config, but serving that identically is unchecked.)"""
    window = heads.config.extra.get("sliding_window")
    if window is not None:
        raise ExportError(
            f"sliding_window {window}: the {format} export cannot carry the draft layer's sliding window, and the "
            f"engine would attend to the whole context instead. Clear it (heads.set_sliding_window(None), then "
            f"save_pretrained) to export heads that draft over the whole context"
        )


def check_verifier(verifier: str) -> None:
    """An explicit verifier must be a model folder or a Hub id: the engine opens it only at serve
    time, where a typo would surface far from the export that wrote it."""
    from ..target import TargetLoadError, check_target_source, named_target

    if named_target(verifier) is not None:
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
    engine_check: bool = True,
) -> Path:
    """Write the heads in ``heads_dir`` as ``format`` ("vllm", "sglang", "speculators") to ``out_dir``.

    ``verifier``: the target as the engine should open it (default: the target the heads recorded;
    "smollm2" is its cache folder). Refuses, naming the reason, heads the format
    cannot hold exactly, an existing ``out_dir`` unless ``overwrite``, and (``engine_check``) a
    layout the installed engine cannot serve (its `registry.EngineLayout.check_engine`)."""
    if format not in EXPORT_FORMATS:
        raise ExportError(f"unknown export format {format!r}; valid: {', '.join(EXPORT_FORMATS)}")
    out = Path(out_dir)
    check_output_folder(out, heads_dir, overwrite)  # never the heads themselves, nor someone's files
    heads = load_heads(heads_dir)
    layout = engine_layout(method_of(heads), format)
    check_no_sliding_window(heads, format)
    check_speculative_tokens(num_speculative_tokens, heads)
    if verifier is not None:
        check_verifier(verifier)
    if engine_check and layout.check_engine is not None:
        layout.check_engine()
    resolved = resolve_verifier(heads.config, verifier)
    folder = layout.write(
        heads, verifier=resolved, verifier_cfg=verifier_config(resolved), num_speculative_tokens=num_speculative_tokens
    )
    local = Path(heads_dir).exists()  # else a Hub id, which load_heads resolved: record the id
    metadata = {"format": format, "head_type": heads.config.head_type,
                "heads": str(Path(heads_dir).absolute()) if local else str(heads_dir), "verifier": resolved,
                "num_speculative_tokens": num_speculative_tokens}
    card = export_card(folder.config, {**metadata, "notes": folder.notes}, heads.config.to_dict(), str(out),
                       source_card(heads_dir))
    counts = token_counts_json(heads)  # no engine tensor holds them: kept for `draftheads import`
    return write_engine_folder(out, folder, metadata, overwrite, card=card,
                               extra_files={TOKEN_COUNTS_NAME: counts} if counts else None)


def engine_layout(method: Method, format: str) -> EngineLayout:
    """How ``format`` holds the heads of ``method``, as it declares; refused, naming the formats
    that exist, when it does not."""
    layout = method.exports.get(format)
    if layout is None:
        raise ExportError(f"{method.name} heads have no {ENGINE_TITLES[format]} layout: formats exist for "
                          f"{layouts_sentence()}")
    return layout


def source_card(heads_dir: str | os.PathLike) -> str | None:
    """The heads folder's model card, if it has one (its training figures go into the export's)."""
    card = resolve_heads_folder(heads_dir) / CARD_NAME
    return card.read_text(encoding="utf-8") if card.is_file() else None
