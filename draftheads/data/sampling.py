"""Length-grouped batches: less padding without packing.

Batches of randomly drawn chat rows are mostly padding when lengths spread widely (a 40-token
exchange padded to the 900-token one beside it), and the target's forward pays for every padded
position. Drawing each batch from rows of similar length removes most of it while every row keeps
its own sequence, so nothing in the losses or the attention masks changes (packing several rows
into one sequence would need block-diagonal attention in the target and in every head loss).

Per epoch: a seeded permutation, cut into mega-batches of ``batch_size * group`` rows; each
mega-batch sorted by length and cut into batches; the full batches shuffled. Every mega-batch is
a whole number of batches, so only the epoch's very last batch can be short, and it stays last:
the DataLoader's consecutive ``batch_size`` indices are exactly these batches, and
``skip_first_batches`` on resume lands where a straight run would be. Same seed, same order on
every process.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler


class LengthGroupedSampler(Sampler[int]):
    def __init__(self, lengths: Sequence[int], batch_size: int, seed: int = 0, group: int = 64) -> None:
        if batch_size < 1 or group < 1:
            raise ValueError(f"batch_size and group must be >= 1, got {batch_size} and {group}")
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.long)
        self.batch_size, self.seed, self.group, self.epoch = batch_size, seed, group, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        """This epoch's batches, in order."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        perm = torch.randperm(len(self.lengths), generator=g)
        mega = self.batch_size * self.group
        out: list[list[int]] = []
        for start in range(0, len(perm), mega):
            chunk = perm[start : start + mega]
            chunk = chunk[torch.argsort(self.lengths[chunk], descending=True, stable=True)].tolist()
            out += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        last = out.pop() if out and len(out[-1]) < self.batch_size else None
        order = torch.randperm(len(out), generator=g).tolist()
        out = [out[i] for i in order] + ([last] if last else [])
        return out

    def __iter__(self) -> Iterator[int]:
        return iter([i for batch in self.batches() for i in batch])

    def __len__(self) -> int:
        return len(self.lengths)


def example_lengths(dataset) -> list[int]:
    """Token count of every example of a tokenized dataset (or a feature-cache dataset)."""
    if hasattr(dataset, "lengths"):
        return list(dataset.lengths())
    out: list[int] = []
    for batch in dataset.select_columns(["input_ids"]).iter(batch_size=4096):  # never the whole column at once
        out += [len(ids) for ids in batch["input_ids"]]
    return out


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of the positions in right-padded batches that are padding."""
    real = sum(lengths[i] for b in batches for i in b)
    padded = sum(max(lengths[i] for i in b) * len(b) for b in batches if b)
    return 1.0 - real / padded if padded else 0.0
