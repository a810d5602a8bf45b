"""Inference: trees, the verifier, proposers and the decode loop."""
from .decoder import SpeculativeDecoder, SpeculativeOutput
from .proposers import DFlashProposer, DraftModelProposer, EagleProposer, HydraProposer, MedusaProposer, PromptLookupProposer, Proposer
from .sampling import SamplingParams
from .tokenizer_check import check_same_tokenizer
from .tree import Tree, TreeShape, default_choices
from .kv.dynamic import commit
from .masks import UnsupportedModelError, tree_attention_mask
from .probe import check_tree_attention
from .verify import TreeVerifier

__all__ = [
    "DFlashProposer",
    "DraftModelProposer",
    "EagleProposer",
    "HydraProposer",
    "MedusaProposer",
    "PromptLookupProposer",
    "Proposer",
    "SamplingParams",
    "SpeculativeDecoder",
    "SpeculativeOutput",
    "Tree",
    "TreeShape",
    "TreeVerifier",
    "UnsupportedModelError",
    "check_same_tokenizer",
    "check_tree_attention",
    "commit",
    "default_choices",
    "tree_attention_mask",
]
