"""A draft KV cache shared by the rows of a batch, each row's entries contiguous from slot 0.

Rows commit different numbers of positions per step (their prompts and accepted counts differ),
so their lengths differ. A step's new entries are written after the longest row (at ``width``,
for every row: a draft layer writes its inputs' keys/values there in place), then each row's
committed ones move to its own end (`settle`: one scatter per layer). So a row's cache is always
[its committed entries, then slots it never reads], the rows are right-padded to the longest,
and a row attends to its first ``length`` slots (`visible`). There are no holes to compact
(EAGLE's `eagle.EagleDrafter` keeps holes instead), and a row leaving the batch is one row selection.
The parallel drafters (`parallel.ParallelDrafter`) keep their context here.
"""
from __future__ import annotations

from typing import Callable

import torch

from .draft_cache import DraftCache, grown


class RowCache:
    """Per-layer key/value buffers [rows, kv heads, capacity, head dim] and each row's length (host ints)."""

    def __init__(self, new_cache: Callable[[int, int], DraftCache]) -> None:
        self._new = new_cache  # (capacity, rows) -> empty buffers
        self.layers: DraftCache | None = None
        self.lengths: list[int] = []

    def start(self, rows: int, capacity: int) -> None:
        """Empty rows; buffers of a former run are reused when they fit (same rows, enough room)."""
        if self.layers is not None and self.layers[0][0].shape[0] != rows:
            self.layers = None
        self.lengths = [0] * rows
        self.reserve(capacity)

    @property
    def width(self) -> int:
        """Slots in use: the longest row."""
        return max(self.lengths, default=0)

    @property
    def uniform(self) -> bool:
        """Every row has the same length (always for one row): nothing to mask, nothing to scatter."""
        return len(set(self.lengths)) <= 1

    def reserve(self, slots: int) -> None:
        """Room for ``slots`` slots (new buffers of at least twice the capacity, the used slots copied)."""
        rows = len(self.lengths)
        self.layers = grown(self.layers, self.width, slots, lambda capacity: self._new(capacity, rows))

    def visible(self, device: torch.device) -> torch.Tensor | None:
        """[rows, width] bool: slot j holds one of row r's committed entries (None when every row
        sees every slot)."""
        if self.uniform:
            return None
        lengths = torch.tensor(self.lengths).to(device, non_blocking=True)
        return torch.arange(self.width, device=device)[None] < lengths[:, None]

    def append(self, kvs: list[tuple[torch.Tensor, torch.Tensor]], counts: list[int]) -> None:
        """Per layer keys/values [rows, kv, m, hd]: row r's first ``counts[r]`` entries become its
        next committed slots. They are written at ``width`` for every row, then `settle` moves
        them; the caller has reserved ``width + m`` slots."""
        start, m = self.width, kvs[0][0].shape[2]
        for (keys, values), (k, v) in zip(self.layers, kvs):
            keys[:, :, start : start + m] = k
            values[:, :, start : start + m] = v
        self.settle(m, counts)

    def settle(self, m: int, counts: list[int]) -> None:
        """The ``m`` entries every row has at slots ``width .. width + m`` (written there by the
        caller, e.g. a draft layer writing into the buffers) become row r's next ``counts[r]``
        committed slots: moved to the row's own end (one scatter per layer; nothing moves when
        every row is as long). Entries past a row's count land past its end, never seen.

        Writing every row at ``width`` first keeps every slot below the width written for every
        row, never uninitialised memory: a masked key still enters attention's arithmetic, and a
        NaN there would turn the row's output into NaN even at weight 0."""
        if not self.uniform:
            start, device = self.width, self.layers[0][0].device
            slots = torch.tensor(self.lengths).to(device, non_blocking=True)[:, None] + torch.arange(m, device=device)
            for keys, values in self.layers:
                index = slots[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
                keys.scatter_(2, index, keys[:, :, start : start + m].clone())  # clone: the slots may overlap
                values.scatter_(2, index, values[:, :, start : start + m].clone())
        self.lengths = [length + c for length, c in zip(self.lengths, counts)]

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` (in this order) stay: one selection of the buffers."""
        index = torch.tensor(rows, dtype=torch.long, device=self.layers[0][0].device)
        self.layers = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.layers]
        self.lengths = [self.lengths[r] for r in rows]

    def prefix(self) -> DraftCache:
        """Per layer the used slots [rows, kv, width, hd] (views)."""
        width = self.width
        return [(k[:, :, :width], v[:, :, :width]) for k, v in self.layers]
