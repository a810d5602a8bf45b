"""THE interface the decode loop drafts through: one call per step for every active row.

Batch 1 is a batch of one row. Drafters that can draft many rows in one call implement
`RowProposer` directly (Medusa/Hydra heads: `medusa.MedusaRows`; EAGLE: `eagle_rows.EagleRows`;
DFlash and P-EAGLE: `dflash.DFlashRows`, `peagle.PEagleRows`), and their per-sequence proposer's
`Proposer.rows` returns that form. Every other drafter is
written per sequence (`base.Proposer`: a draft model, prompt lookup) and wrapped here, once, by
`ForkedRows`: one forked proposer per row.
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree import Tree


class RowProposer:
    """Drafts for the rows of a batch; rows are positions in the active batch, in order."""

    #: The target hidden states `start` and `accepted` receive, as `Proposer.feature_layers`.
    feature_layers: tuple[int, ...] = (-1,)

    # The request's settings, which `start` records (before `start`: greedy).
    _params: SamplingParams = SamplingParams()
    _generator: torch.Generator | None = None

    def bind_target(self, target: torch.nn.Module) -> None:
        """As `Proposer.bind_target` (optional)."""

    def rows(self, compaction: str = "auto") -> "RowProposer":
        """The batch form the loop drafts through: this one."""
        return self

    def start(self, prompts: list[torch.Tensor], hidden: list[torch.Tensor | None], params: SamplingParams,
              generator: torch.Generator | None) -> None:
        """New sequences: per row its prompt [L] and the target's features [L, F] (or None)."""
        raise NotImplementedError

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        """Per row a tree rooted at its next token, at most its ``max_depths`` drafted tokens deep
        (0: the root alone, a plain step)."""
        raise NotImplementedError

    def accepted(self, tokens: list[torch.Tensor], hidden: list[torch.Tensor | None]) -> None:
        """Per row the root and accepted drafts [m] (now in the target's cache) and their features."""
        raise NotImplementedError

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` (positions in the current batch, in order) go on decoding."""
        raise NotImplementedError

    def stats(self) -> dict:
        return {}


class ForkedRows(RowProposer):
    """A per-sequence `Proposer` for every row: the proposer itself for one row (its state after
    the call is what the caller sees, its stats are the output's), one `Proposer.fork` per row for
    more (their stats under ``row_stats``)."""

    def __init__(self, proposer) -> None:  # a `base.Proposer` (base imports this module)
        self.proposer = proposer
        self.feature_layers = proposer.feature_layers
        self.forks: list = []
        self._all: list = []

    def start(self, prompts, hidden, params, generator) -> None:
        self.forks = [self.proposer] if len(prompts) == 1 else [self.proposer.fork() for _ in prompts]
        self._all = list(self.forks)  # every row, finished ones too, for the stats
        for row, ids, h in zip(self.forks, prompts, hidden):
            row.start(ids, h, params, generator)

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        return [row.propose(root, d) for row, root, d in zip(self.forks, roots, max_depths)]

    def accepted(self, tokens, hidden) -> None:
        for row, t, h in zip(self.forks, tokens, hidden):
            row.accepted(t, h)

    def keep(self, rows: list[int]) -> None:
        self.forks = [self.forks[r] for r in rows]

    def stats(self) -> dict:
        if len(self._all) == 1:
            return self._all[0].stats()
        return {"row_stats": [row.stats() for row in self._all]}
