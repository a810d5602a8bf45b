"""A draft KV cache shared by the rows of a batch, each row's entries contiguous from slot 0.

Rows commit different numbers of positions per step (their prompts and accepted counts differ),
so their lengths differ. Here a row's new entries are written at ITS OWN length (one scatter per
layer), never at a common offset: a row's cache is always [its committed entries, then unused
slots], the rows are right-padded to the longest, and a row attends to its first ``length``
slots (`visible`). There are no holes to compact (EAGLE's `eagle_rows` keeps holes instead,
because its draft layer writes all rows' new entries at one offset), and a row leaving the batch
is one row selection. The parallel drafters (`parallel.ParallelRows`) keep their context here.
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

    def write(self, kvs: list[tuple[torch.Tensor, torch.Tensor]], counts: list[int]) -> None:
        """Append per layer keys/values [rows, kv, m, hd]: row r's first ``counts[r]`` entries
        become its next committed slots (its other entries land past its end, never seen). The
        caller has reserved ``width + m`` slots. ``kvs`` may be views of the buffers themselves."""
        m = kvs[0][0].shape[2]
        if self.uniform:
            start = self.width
            for (keys, values), (k, v) in zip(self.layers, kvs):
                keys[:, :, start : start + m] = k
                values[:, :, start : start + m] = v
        else:
            device = self.layers[0][0].device
            slots = torch.tensor(self.lengths).to(device, non_blocking=True)[:, None] + torch.arange(m, device=device)
            for (keys, values), (k, v) in zip(self.layers, kvs):
                index = slots[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])
                keys.scatter_(2, index, k.clone())  # clone: k may alias the slots it moves to
                values.scatter_(2, index, v.clone())
        self.advance(counts)

    def advance(self, counts: list[int]) -> None:
        """Row r's next ``counts[r]`` slots, written in place by the caller (at ``width``, with
        every row as long), are now committed."""
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
