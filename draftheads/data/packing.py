"""Sequence packing: whole rows laid end to end in fixed-length windows, so batches carry
almost no padding.

A chat set's rows spread from a few dozen to thousands of tokens; padded batches (even
length-grouped ones) pay the target's forward for every padded position. Packing places rows
into windows of ``data.pack_length`` tokens (``data.max_length`` unless set) by best-fit
decreasing, which leaves a window's tail empty only when no remaining row fits there.

Each window keeps its documents apart: ``position_ids`` restart at 0 at every row's first token.
The collator adds them to the batch and the training model derives everything else from them
(block-diagonal attention in the target and the draft layers, losses that never pair tokens of
two documents: ``draftheads/train/packing.py``).

A row longer than the window is split (``pack_overflow: split``: pieces of at most the window,
consecutive pieces sharing one token, which is context only in the later piece, like the text
chunking of ``tokenize.py``) or dropped (``drop``); either is counted and reported.

The packing is a pure function of the rows' lengths and the window, so every process and every
resumed run sees the same windows (the sampler shuffles whole windows per epoch).
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .config import PACK_OVERFLOW as OVERFLOW

Piece = tuple[int, int, int]  # (row, first token, one past the last token)


@dataclass
class PackingStats:
    """What packing did to the rows: reported in the training log."""

    window: int
    rows: int = 0
    windows: int = 0
    tokens: int = 0  # tokens placed in windows
    overflow: str = "split"
    long_rows: int = 0  # rows longer than the window
    pieces: int = 0  # pieces the long rows became (split)
    dropped_tokens: int = 0  # tokens of the long rows left out (drop)

    @property
    def padding_fraction(self) -> float:
        """Share of the windows' positions (``windows x window``) that hold no token."""
        total = self.windows * self.window
        return 1.0 - self.tokens / total if total else 0.0

    def summary(self) -> str:
        text = (
            f"packing: {self.rows} rows -> {self.windows} windows of {self.window} tokens "
            f"({self.tokens} tokens, padding {100 * self.padding_fraction:.1f}%)"
        )
        if self.long_rows and self.overflow == "split":
            text += f"; {self.long_rows} rows longer than the window were split into {self.pieces} pieces"
        elif self.long_rows:
            text += (
                f"; {self.long_rows} rows longer than the window were DROPPED ({self.dropped_tokens} tokens); "
                "set data.pack_overflow: split to keep them"
            )
        return text


def split_row(length: int, window: int) -> list[tuple[int, int]]:
    """``(start, stop)`` pieces of at most ``window`` tokens covering a row; consecutive pieces
    share one token (the last target of one piece is the first context token of the next)."""
    if length <= window:
        return [(0, length)]
    stride = window - 1
    return [(s, min(s + window, length)) for s in range(0, length - 1, stride)]


def pack_rows(lengths: Sequence[int], window: int, overflow: str = "split") -> tuple[list[list[Piece]], PackingStats]:
    """Windows (lists of pieces) holding every row (or piece) exactly once, best-fit decreasing:
    longest first, each into the fullest window it still fits in (a new one if none)."""
    if window < 2:
        raise ValueError(f"the packing window must hold at least 2 tokens, got {window}")
    if overflow not in OVERFLOW:
        raise ValueError(f"data.pack_overflow={overflow!r} is not one of {', '.join(OVERFLOW)}")
    stats = PackingStats(window=window, rows=len(lengths), overflow=overflow)
    pieces: list[Piece] = []
    for row, n in enumerate(lengths):
        n = int(n)
        if n < 1:
            continue
        if n > window:
            stats.long_rows += 1
            if overflow == "drop":
                stats.dropped_tokens += n
                continue
            parts = split_row(n, window)
            stats.pieces += len(parts)
            pieces += [(row, a, b) for a, b in parts]
        else:
            pieces.append((row, 0, n))
    pieces.sort(key=lambda p: (-(p[2] - p[1]), p[0], p[1]))
    windows: list[list[Piece]] = []
    free: list[tuple[int, int]] = []  # (room left, window index), sorted
    for piece in pieces:
        size = piece[2] - piece[1]
        at = bisect.bisect_left(free, (size, -1))
        if at < len(free):
            room, w = free.pop(at)
        else:
            room, w = window, len(windows)
            windows.append([])
        windows[w].append(piece)
        if room - size > 0:
            bisect.insort(free, (room - size, w))
        stats.tokens += size
    stats.windows = len(windows)
    return windows, stats


class PackedDataset(torch.utils.data.Dataset):
    """Windows over a dataset of rows (tokenized examples, or feature-cache rows): item i is
    window i's pieces concatenated, every per-token field alike (``input_ids``, ``loss_mask``,
    and cached ``hidden``/``features``/``target_labels``), plus ``position_ids``."""

    def __init__(self, rows: Any, windows: Sequence[Sequence[Piece]]) -> None:
        self.rows, self.windows = rows, [list(w) for w in windows]

    def __len__(self) -> int:
        return len(self.windows)

    def lengths(self) -> list[int]:
        return [sum(b - a for _, a, b in w) for w in self.windows]

    def __getitem__(self, i: int) -> dict[str, Any]:
        parts: dict[str, list] = {}
        positions = []
        for row, start, stop in self.windows[i]:
            item = self.rows[row]
            for key, value in item.items():
                piece = value[start:stop]
                if key == "loss_mask" and start > 0:  # the shared token is context in this piece
                    piece = _zero_first(piece)
                parts.setdefault(key, []).append(piece)
            positions.append(torch.arange(stop - start))
        out: dict[str, Any] = {key: _concat(values) for key, values in parts.items()}
        out["position_ids"] = torch.cat(positions)
        return out


class PackingCollator:
    """The row collator (tokens, or tokens plus cached features) over windows, plus their
    ``position_ids`` [B, S]: each document's 0, 1, ..., then one more run 0, 1, ... over the
    padding, so the padding is a document of its own that no real token attends to."""

    def __init__(self, base: Callable[[Sequence[Mapping[str, Any]]], dict[str, torch.Tensor]]) -> None:
        self.base = base

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.base(examples)
        length = batch["input_ids"].shape[1]
        positions = torch.zeros(len(examples), length, dtype=torch.long)
        for i, ex in enumerate(examples):
            p = torch.as_tensor(ex["position_ids"], dtype=torch.long)
            positions[i, : len(p)] = p
            positions[i, len(p) :] = torch.arange(length - len(p))
        batch["position_ids"] = positions
        return batch


def pack_dataset(rows: Any, lengths: Sequence[int], window: int, overflow: str = "split") -> tuple[PackedDataset, PackingStats]:
    """``rows`` (with their token ``lengths``) as packed windows, and what packing did."""
    windows, stats = pack_rows(lengths, window, overflow)
    return PackedDataset(rows, windows), stats


def _zero_first(piece: Any) -> Any:
    if isinstance(piece, torch.Tensor):
        piece = piece.clone()
        piece[0] = 0
        return piece
    return [0, *list(piece)[1:]]


def _concat(values: list) -> Any:
    if isinstance(values[0], torch.Tensor):
        return torch.cat(values)
    return [x for v in values for x in (v.tolist() if hasattr(v, "tolist") else v)]
