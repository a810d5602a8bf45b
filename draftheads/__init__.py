"""draftheads: train speculative-decoding draft heads on a frozen Hugging Face LM, decode losslessly."""
from .heads import Eagle3Head, EagleHead, HeadsConfig, HydraHeads, MedusaHeads, PEagleHead, TargetInfo, load_heads, save_heads
from .inference import (
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
    "DraftModelProposer",
    "Eagle3Head",
    "EagleHead",
    "EagleProposer",
    "HeadsConfig",
    "PEagleHead",
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
