"""Drafters written for ONE sequence (a draft model, prompt lookup), and the one adapter that
makes them a `drafter.Drafter`.

Some drafting methods are naturally per sequence: their state is one token list, and batching
them would buy nothing. They implement the small `Proposer` protocol below; `ForkedRows` runs one
fork of it per row. This protocol is how such a drafter is written, not a second interface the
decoder drafts through: the decoder wraps any `Proposer` it is given (`as_drafter`) and the loop
only ever sees a `Drafter`.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch

from ..sampling import SamplingParams
from ..tree import Tree
from .drafter import Drafter


class Proposer(ABC):
    """One sequence's drafter: `start`, then `propose` / `accepted` per step."""

    #: As `Drafter.feature_layers`.
    feature_layers: tuple[int, ...] = (-1,)

    # The request's settings, which `start` records (a proposer used before `start`: greedy).
    _params: SamplingParams = SamplingParams()
    _generator: torch.Generator | None = None

    def bind_target(self, target: torch.nn.Module) -> None:
        """As `Drafter.bind_target` (optional)."""

    @abstractmethod
    def start(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> None:
        """A new sequence: ``input_ids`` [L] is the prompt, ``hidden`` [L, F] the target's
        `feature_layers` at every prompt position (None when it reads none)."""

    @abstractmethod
    def propose(self, root: int, max_depth: int) -> Tree:
        """Candidates rooted at ``root`` (the next token, decided but not yet in the target's
        cache), at most ``max_depth`` drafted tokens deep."""

    @abstractmethod
    def accepted(self, tokens: torch.Tensor, hidden: torch.Tensor) -> None:
        """After verification: ``tokens`` [m] are the root and the accepted drafts (now in the
        target's cache), ``hidden`` [m, F] the target's `feature_layers` at those positions (None
        when it reads none)."""

    def stats(self) -> dict:
        """Proposer-specific figures for the output's ``stats`` (e.g. the chosen draft length)."""
        return {}

    def fork(self) -> "Proposer":
        """An independent proposer for one more sequence decoded alongside this one (batch > 1):
        same settings and models, its own per-sequence state. `start` resets that state, so a
        shallow copy is enough unless the proposer keeps buffers that `start` reuses."""
        return copy.copy(self)


class ForkedRows(Drafter):
    """A per-sequence `Proposer` for every row: the proposer itself for one row (its state after
    the call is what the caller sees, its stats are the output's), one `Proposer.fork` per row for
    more (their stats under ``row_stats``)."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer
        self.feature_layers = proposer.feature_layers
        self.forks: list[Proposer] = []
        self._all: list[Proposer] = []

    @property
    def name(self) -> str:
        return type(self.proposer).__name__

    def bind_target(self, target: torch.nn.Module) -> None:
        self.proposer.bind_target(target)

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


def as_drafter(source: object) -> Drafter | None:
    """``source`` as the loop drafts through it: a `Drafter` itself, a per-sequence `Proposer`
    wrapped once (`ForkedRows`), None for anything else (heads, which build their own drafter)."""
    if isinstance(source, Drafter):
        return source
    if isinstance(source, Proposer):
        return ForkedRows(source)
    return None
