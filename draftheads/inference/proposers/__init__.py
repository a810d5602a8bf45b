"""Drafting strategies. Each returns a candidate Tree; one verifier checks them all.

Importing this package registers the proposer of each head type, so that ``heads.proposer()``
(heads never import the inference layer) finds how to draft them.
"""
from ...heads.base import register_proposer
from .base import Proposer
from .dflash import DFlashProposer, dflash_proposer
from .draft_model import AdaptiveGamma, DraftModelProposer
from .eagle import EagleProposer, eagle_proposer
from .hydra import HydraProposer
from .medusa import MedusaProposer
from .prompt_lookup import PromptLookupProposer

register_proposer("medusa", MedusaProposer)
register_proposer("hydra", HydraProposer)
register_proposer("dflash", dflash_proposer)
register_proposer("eagle", eagle_proposer)  # EAGLE-3 heads are EagleHead subclasses: the same proposer

__all__ = ["AdaptiveGamma", "DFlashProposer", "DraftModelProposer", "EagleProposer", "HydraProposer", "MedusaProposer", "PromptLookupProposer", "Proposer"]
