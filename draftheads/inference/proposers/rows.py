"""Proposers for a batch of sequences: one tree per row, rows dropping out as they finish.

Medusa and Hydra heads draft every row in one batched call (`draft_rows`): their only
per-sequence state is the last hidden state. EAGLE and EAGLE-3 draft every row with one
draft-layer forward per depth over a shared draft KV cache (`eagle_rows.EagleRows`). Every other
proposer (a draft LM, prompt lookup) keeps per-sequence state, so each row gets its own
`Proposer.fork` and drafts on its own.
"""
from __future__ import annotations

import torch

from ..tree import Tree
from .base import Proposer
from .eagle import EagleProposer
from .eagle_rows import EagleRows
from .hydra import HydraProposer
from .medusa import MedusaProposer
from .row_base import RowProposer

__all__ = ["EagleRows", "ForkedRows", "HeadsRows", "RowProposer", "row_proposer", "truncate"]


def truncate(tree: Tree, max_depth: int) -> Tree:
    """``tree`` without nodes deeper than ``max_depth``: a row near max_new_tokens in a batch drafted
    deeper. Exact for heads whose nodes depend only on their ancestors (Medusa, Hydra)."""
    if max_depth >= tree.shape.max_depth:
        return tree
    keep = tree.shape.depth <= max_depth
    return Tree(tree.shape.truncated(max_depth), tree.tokens[keep])


class HeadsRows(RowProposer):
    """Medusa or Hydra heads drafting all rows at once from each row's last hidden state."""

    def __init__(self, proposer: MedusaProposer) -> None:
        self.proposer = proposer
        self._last: torch.Tensor | None = None  # [rows, H]

    def start(self, prompts, hidden, params, generator) -> None:
        self._last = torch.stack([h[-1] for h in hidden])

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        shape, tokens = self.proposer.draft_rows(torch.tensor(roots), self._last, max(max_depths))
        return [truncate(Tree(shape, tokens[r]), d) for r, d in enumerate(max_depths)]

    def accepted(self, tokens, hidden) -> None:
        self._last = torch.stack([h[-1] for h in hidden])

    def keep(self, rows: list[int]) -> None:
        self._last = self._last[rows]


class ForkedRows(RowProposer):
    """One forked proposer per row, each drafting its own tree."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer
        self.rows: list[Proposer] = []
        self._all: list[Proposer] = []

    def start(self, prompts, hidden, params, generator) -> None:
        self.rows = [self.proposer.fork() for _ in prompts]
        self._all = list(self.rows)  # every row, finished ones too, for the stats
        for row, ids, h in zip(self.rows, prompts, hidden):
            row.start(ids, h, params, generator)

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        return [row.propose(root, d) for row, root, d in zip(self.rows, roots, max_depths)]

    def accepted(self, tokens, hidden) -> None:
        for row, t, h in zip(self.rows, tokens, hidden):
            row.accepted(t, h)

    def observe(self, drafted, accepted, verify_seconds) -> None:
        for row, d, a in zip(self.rows, drafted, accepted):
            row.observe(d, a, verify_seconds)

    def keep(self, rows: list[int]) -> None:
        self.rows = [self.rows[r] for r in rows]

    def stats(self) -> dict:
        return {"row_stats": [row.stats() for row in self._all]}


def row_proposer(proposer: Proposer) -> RowProposer:
    """The batched form of ``proposer``: batched drafting where the method allows it."""
    if isinstance(proposer, (MedusaProposer, HydraProposer)) and hasattr(proposer, "draft_rows"):
        return HeadsRows(proposer)
    if isinstance(proposer, EagleProposer):
        return EagleRows(proposer)
    return ForkedRows(proposer)
