"""draftheads: train speculative-decoding draft heads on a frozen Hugging Face LM, decode losslessly."""
from .heads import HeadsConfig, MedusaHeads, TargetInfo, load_heads, save_heads
from .inference import (
    MedusaProposer,
    Proposer,
    SamplingParams,
    SpeculativeDecoder,
    SpeculativeOutput,
    Tree,
    TreeShape,
    UnsupportedModelError,
)

__version__ = "0.1.0"

__all__ = [
    "HeadsConfig",
    "MedusaHeads",
    "MedusaProposer",
    "Proposer",
    "SamplingParams",
    "SpeculativeDecoder",
    "SpeculativeOutput",
    "TargetInfo",
    "Tree",
    "TreeShape",
    "UnsupportedModelError",
    "load_heads",
    "save_heads",
    "__version__",
]
