"""Drafting strategies. Each returns a candidate Tree; one verifier checks them all."""
from .base import Proposer
from .medusa import MedusaProposer

__all__ = ["MedusaProposer", "Proposer"]
