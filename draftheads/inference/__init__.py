"""Inference: trees, the verifier, proposers and the decode loop."""
from .decoder import SpeculativeDecoder, SpeculativeOutput
from .proposers import MedusaProposer, Proposer
from .sampling import SamplingParams
from .tree import Tree, TreeShape, default_choices
from .verify import TreeVerifier, UnsupportedModelError, check_tree_attention, commit, tree_attention_mask

__all__ = [
    "MedusaProposer",
    "Proposer",
    "SamplingParams",
    "SpeculativeDecoder",
    "SpeculativeOutput",
    "Tree",
    "TreeShape",
    "TreeVerifier",
    "UnsupportedModelError",
    "check_tree_attention",
    "commit",
    "default_choices",
    "tree_attention_mask",
]
