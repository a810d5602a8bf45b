"""The arithmetic of one optimizer step: the order its micro-batches come in, what its loss is
divided by, where its training noise comes from, and the label counts it adds to the heads.

Each rule is what makes a resumed run, or one on another number of processes, make exactly the
updates a straight run makes.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import Sampler

from .model import TargetWithHeads


class EpochShuffleSampler(Sampler[int]):
    """A fresh permutation per epoch from ``seed + epoch``: the same on every process and on resume,
    so ``skip_first_batches`` lands on exactly the batches a straight run would have seen next."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=g).tolist())

    def __len__(self) -> int:
        return self.size


def step_denominators(accelerator, core: TargetWithHeads, group: list[dict], grad_accum: int) -> torch.Tensor:
    """The loss denominators of one optimizer step (a collective: call on every process).

    Each head's loss is its summed cross-entropy over the step's tokens divided by their count
    over every micro-batch and process (the step's token-level mean), not a mean per micro-batch
    and process, which would weight a token by how full its micro-batch happened to be. The count
    is divided by ``grad_accum x processes`` because ``backward`` divides the loss by
    ``grad_accum`` and DDP/ZeRO average gradients over processes: the summed gradient is then
    exactly the gradient of the step's mean."""
    local = sum(core.loss_counts(b["input_ids"], b.get("attention_mask"), b.get("loss_mask"), b.get("position_ids"))
                for b in group)
    total = accelerator.reduce(local.to(accelerator.device, torch.float64), reduction="sum")
    return (total / (grad_accum * accelerator.num_processes)).float()


def noise_seed(seed: int, process: int, epoch: int, batch_in_epoch: int) -> int:
    """A seed for the training noise of one micro-batch: a function of where the batch is in the
    run (not of what consumed the global RNG before), different on every process."""
    return (((seed * 1_000_003 + process) * 1_000_003 + epoch) * 1_000_003 + batch_in_epoch) % (2**63 - 1)


def data_position(epoch: int, batch_in_epoch: int, batches_per_epoch: int) -> tuple[int, int]:
    """Where the data stands after ``batch_in_epoch`` batches: the next epoch if this one is done."""
    return (epoch + 1, 0) if batch_in_epoch >= batches_per_epoch else (epoch, batch_in_epoch)


def merge_label_counts(accelerator, heads: torch.nn.Module, label_counts: torch.Tensor) -> None:
    """Add every process's label counts to ``heads.token_counts`` (identical on all ranks after),
    then restart the local tally. Called before each checkpoint and before the export."""
    heads.token_counts += accelerator.reduce(label_counts, reduction="sum").to(heads.token_counts.device)
    label_counts.zero_()
