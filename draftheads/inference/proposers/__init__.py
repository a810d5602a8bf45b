"""Drafting strategies behind ONE interface (`drafter.Drafter`, batch-first); one verifier checks
every tree they return.

Each head type's drafter lives with its method (draftheads/methods/<type>/drafter.py), which
declares it, so that ``heads.proposer()`` finds it through draftheads.registry; what several of
them share (the one-forward block drafter `parallel.ParallelDrafter`, row caches, sampling) is here. Per-sequence drafters (prompt lookup,
a draft model) are written as `sequence.Proposer` and wrapped once (`sequence.ForkedRows`).
"""
from typing import Any

from ...registry import moved
from .draft_model import DraftModelProposer
from .drafter import Drafter
from .prompt_lookup import PromptLookupProposer
from .sequence import ForkedRows, Proposer, as_drafter

__all__ = ["DraftModelProposer", "Drafter", "ForkedRows", "PromptLookupProposer", "Proposer", "as_drafter"]


def __getattr__(name: str) -> Any:
    """The head drafters that lived here (``MedusaDrafter``, and their former ``...Proposer``
    names): deprecated, found through the registry (`registry.moved`)."""
    return moved(__name__, name)
