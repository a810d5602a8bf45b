"""Inference: trees, the verifier, drafters and the decode loop."""
from typing import Any

from ..registry import moved
from .decoder import SpeculativeDecoder, SpeculativeOutput
from .proposers import DraftModelProposer, Drafter, PromptLookupProposer, Proposer
from .sampling import SamplingParams
from .tokenizer_check import check_same_tokenizer
from .tree import Tree, TreeShape, default_choices
from .kv.dynamic import commit
from .masks import UnsupportedModelError, tree_attention_mask
from .probe import check_tree_attention
from .verify import TreeVerifier

__all__ = [
    "DraftModelProposer",
    "Drafter",
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


def __getattr__(name: str) -> Any:
    """The head drafters this package exported (``MedusaDrafter``, ``MedusaProposer``): deprecated,
    found through the registry (`registry.moved`); import them from draftheads."""
    return moved(__name__, name)
