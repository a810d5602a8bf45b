"""draftheads: train speculative-decoding draft heads on a frozen Hugging Face LM, decode losslessly."""
from .heads import DFlashHeads, Eagle3Head, EagleHead, HeadsConfig, HydraHeads, MedusaHeads, TargetInfo, load_heads, save_heads
from .inference import (
    DFlashProposer,
    DraftModelProposer,
    EagleProposer,
    HydraProposer,
    MedusaProposer,
    PromptLookupProposer,
    Proposer,
    SamplingParams,
    SpeculativeDecoder,
    SpeculativeOutput,
    Tree,
    TreeShape,
    UnsupportedModelError,
    check_same_tokenizer,
)

__version__ = "0.1.0"

__all__ = [
    "DFlashHeads",
    "DFlashProposer",
    "DraftModelProposer",
    "Eagle3Head",
    "EagleHead",
    "EagleProposer",
    "HeadsConfig",
    "HydraHeads",
    "HydraProposer",
    "MedusaHeads",
    "MedusaProposer",
    "PromptLookupProposer",
    "Proposer",
    "SamplingParams",
    "SpeculativeDecoder",
    "SpeculativeOutput",
    "TargetInfo",
    "Tree",
    "TreeShape",
    "UnsupportedModelError",
    "check_same_tokenizer",
    "load_heads",
    "save_heads",
    "__version__",
]
