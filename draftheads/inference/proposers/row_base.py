"""The interface the batched decode loop drafts through: one call per step for all active rows.

Its own module so that the batched proposers (rows.py, eagle_rows.py) and the routing in rows.py
import it without importing each other in a circle.
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree import Tree


class RowProposer:
    """The batch interface the batched decode loop calls; rows are positions in the active batch."""

    def start(self, prompts: list[torch.Tensor], hidden: list[torch.Tensor | None], params: SamplingParams,
              generator: torch.Generator | None) -> None:
        raise NotImplementedError

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        raise NotImplementedError

    def accepted(self, tokens: list[torch.Tensor], hidden: list[torch.Tensor | None]) -> None:
        raise NotImplementedError

    def observe(self, drafted: list[int], accepted: list[int], verify_seconds: float) -> None:
        """Per-row feedback, as `Proposer.observe` (optional)."""

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` (positions in the current batch, in order) go on decoding."""
        raise NotImplementedError

    def stats(self) -> dict:
        return {}
