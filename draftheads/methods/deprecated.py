"""The head drafters' former per-sequence names, kept so that code written against them still runs.

Each head type once had a per-sequence proposer beside its batch drafter; the batch drafter is now
the only one (a batch of one is one sequence). These names warn and build the drafter, which takes
the same arguments; its calls are the batch ones (`drafter.Drafter`: lists of rows).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

from .dflash.drafter import DFlashDrafter
from .eagle.drafter import EagleDrafter
from .hydra.drafter import HydraDrafter
from .medusa.drafter import MedusaDrafter
from .peagle.drafter import PEagleDrafter


def _renamed(old: str, drafter: type) -> Callable[..., Any]:
    def build(*args: Any, **kwargs: Any) -> Any:
        warnings.warn(
            f"{old} is deprecated: use {drafter.__name__} (same arguments; it drafts a batch of rows, a batch of "
            "one for one sequence), or heads.proposer() / SpeculativeDecoder(target, heads)",
            DeprecationWarning, stacklevel=2)
        return drafter(*args, **kwargs)

    build.__name__ = build.__qualname__ = old
    build.__doc__ = f"Deprecated: builds a `{drafter.__name__}`."
    return build


DFlashProposer = _renamed("DFlashProposer", DFlashDrafter)
EagleProposer = _renamed("EagleProposer", EagleDrafter)
HydraProposer = _renamed("HydraProposer", HydraDrafter)
MedusaProposer = _renamed("MedusaProposer", MedusaDrafter)
PEagleProposer = _renamed("PEagleProposer", PEagleDrafter)
