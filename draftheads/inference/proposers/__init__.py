"""Drafting strategies. Each returns a candidate Tree; one verifier checks them all.

Importing this package registers the proposer of each head type, so that ``heads.proposer()``
(heads never import the inference layer) finds how to draft them.
"""
from ...heads.base import register_proposer
from .base import Proposer
from .dflash import DFlashProposer, dflash_proposer
from .draft_model import DraftModelProposer
from .eagle import EagleProposer, eagle_proposer
from .hydra import HydraProposer
from .medusa import MedusaProposer
from .peagle import PEagleProposer, peagle_proposer
from .prompt_lookup import PromptLookupProposer

register_proposer("medusa", MedusaProposer)
register_proposer("hydra", HydraProposer)
register_proposer("dflash", dflash_proposer)
register_proposer("eagle", eagle_proposer)  # EAGLE-3 heads are EagleHead subclasses: the same proposer
register_proposer("peagle", peagle_proposer)  # P-EAGLE: an EAGLE-3 subclass with its own one-forward proposer

__all__ = ["DFlashProposer", "DraftModelProposer", "EagleProposer", "HydraProposer", "MedusaProposer", "PEagleProposer", "PromptLookupProposer", "Proposer"]
