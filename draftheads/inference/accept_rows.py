"""Greedy acceptance for a whole batch at once: one host read per step, however many rows.

`TreeVerifier.accept_greedy` does it for one tree with one transfer; calling it per row would
make a batch of B rows stall the device B times a step. Here one ``tolist`` brings back every
row's argmaxes and tree tokens, and each row's tree is walked on the host.
"""
from __future__ import annotations

import torch

from .tree import Tree
from .verify import Acceptance, greedy_acceptance


def accept_greedy_rows(trees: list[Tree], tokens: torch.Tensor, logits: torch.Tensor) -> list[Acceptance]:
    """Per row, what `TreeVerifier.accept_greedy` picks for that row's tree alone.

    ``tokens`` [rows, n] are the trees' tokens as verified (padded, on the logits' device) and
    ``logits`` [rows, n, V] the verify forward's output."""
    n = tokens.shape[1]
    packed = torch.cat([logits.argmax(dim=-1), tokens.to(logits.device, non_blocking=True)], dim=1).tolist()
    return [greedy_acceptance(tree.shape, row[:n], row[n:]) for tree, row in zip(trees, packed)]
