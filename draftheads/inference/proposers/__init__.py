"""Drafting strategies. Each returns a candidate Tree; one verifier checks them all.

Which proposer drafts which heads is declared by each method (draftheads/methods/), so that
``heads.proposer()`` finds it through draftheads.registry.
"""
from .base import Proposer
from .dflash import DFlashProposer
from .draft_model import DraftModelProposer
from .eagle import EagleProposer
from .hydra import HydraProposer
from .medusa import MedusaProposer
from .peagle import PEagleProposer
from .prompt_lookup import PromptLookupProposer

__all__ = ["DFlashProposer", "DraftModelProposer", "EagleProposer", "HydraProposer", "MedusaProposer", "PEagleProposer", "PromptLookupProposer", "Proposer"]
