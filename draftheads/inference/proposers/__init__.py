"""Drafting strategies. Each returns a candidate Tree; one verifier checks them all."""
from .base import Proposer
from .draft_model import AdaptiveGamma, DraftModelProposer
from .medusa import MedusaProposer
from .prompt_lookup import PromptLookupProposer

__all__ = ["AdaptiveGamma", "DraftModelProposer", "MedusaProposer", "PromptLookupProposer", "Proposer"]
