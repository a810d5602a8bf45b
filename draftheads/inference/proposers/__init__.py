"""Drafting strategies. Each returns a candidate Tree; one verifier checks them all."""
from .base import Proposer
from .draft_model import AdaptiveGamma, DraftModelProposer
from .eagle import EagleProposer
from .hydra import HydraProposer
from .medusa import MedusaProposer
from .prompt_lookup import PromptLookupProposer

__all__ = ["AdaptiveGamma", "DraftModelProposer", "EagleProposer", "HydraProposer", "MedusaProposer", "PromptLookupProposer", "Proposer"]
