"""Drafting strategies behind ONE interface (`drafter.Drafter`, batch-first); one verifier checks
every tree they return.

Which drafter drafts which heads is declared by each method (draftheads/methods/), so that
``heads.proposer()`` finds it through draftheads.registry. Per-sequence drafters (prompt lookup,
a draft model) are written as `sequence.Proposer` and wrapped once (`sequence.ForkedRows`).
"""
from .deprecated import DFlashProposer, EagleProposer, HydraProposer, MedusaProposer, PEagleProposer
from .dflash import DFlashDrafter
from .draft_model import DraftModelProposer
from .drafter import Drafter
from .eagle import EagleDrafter
from .hydra import HydraDrafter
from .medusa import MedusaDrafter
from .peagle import PEagleDrafter
from .prompt_lookup import PromptLookupProposer
from .sequence import ForkedRows, Proposer, as_drafter

__all__ = ["DFlashDrafter", "DFlashProposer", "DraftModelProposer", "Drafter", "EagleDrafter", "EagleProposer",
           "ForkedRows", "HydraDrafter", "HydraProposer", "MedusaDrafter", "MedusaProposer", "PEagleDrafter",
           "PEagleProposer", "PromptLookupProposer", "Proposer", "as_drafter"]
