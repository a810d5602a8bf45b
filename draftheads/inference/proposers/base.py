"""The per-sequence proposer interface: a drafting method written for one sequence implements
these three calls; the loop drafts every row through `rows()` (`row_base.RowProposer`).

The decode loop owns the target, its cache and the verifier; a proposer only sees tokens and
the target's hidden states, and returns a candidate Tree. Nothing about attention masks or
caches of the target leaks into a proposer (cf. transformers' CandidateGenerator).
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch

from ..sampling import SamplingParams
from ..tree import Tree
from .row_base import ForkedRows, RowProposer


class Proposer(ABC):
    #: The target hidden states `start` and `accepted` receive, in ``output_hidden_states``
    #: numbering: ``(-1,)`` = the last hidden state after the final norm (Medusa, Hydra, EAGLE);
    #: layer ids ``i`` = the states entering decoder layers i, concatenated (EAGLE-3); ``()`` = none
    #: (prompt lookup, draft models: they get ``hidden=None``). The verifier captures exactly these,
    #: never all L+1 hidden states.
    feature_layers: tuple[int, ...] = (-1,)

    # The request's settings, which `start` records (a proposer used before `start`: greedy).
    _params: SamplingParams = SamplingParams()
    _generator: torch.Generator | None = None

    def bind_target(self, target: torch.nn.Module) -> None:
        """Called once by the decoder with the target (optional): a proposer with its own model
        checks here that it fits the target (e.g. a draft LM's vocabulary) and raises otherwise."""

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

    def rows(self, compaction: str = "auto") -> RowProposer:
        """The batch form the decode loop drafts through (batch 1 is a batch of one row): one
        forked proposer per row here; drafters that batch their rows (heads, EAGLE, DFlash, P-EAGLE) return their own.
        ``compaction`` is the decoder's policy for caches with holes (`inference.compaction`)."""
        return ForkedRows(self)
