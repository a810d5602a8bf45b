"""draftheads: train speculative-decoding draft heads on a frozen Hugging Face LM, decode losslessly.

The public names load on first use (``dh.SpeculativeDecoder`` imports torch and transformers
then), so ``import draftheads`` and the command line's ``--help`` stay fast."""
from typing import TYPE_CHECKING

from .lazy import lazy_exports
from .registry import set_loader


def _register_methods() -> None:
    """Register every drafting method (draftheads/methods/): run by the registry at its first lookup."""
    from . import methods  # noqa: F401


set_loader(_register_methods)

_HEADS = ("Eagle3Head", "EagleHead", "HeadsConfig", "HydraHeads", "MedusaHeads", "PEagleHead", "DFlashHeads", "TargetInfo", "load_heads",
          "save_heads")
_INFERENCE = (
    "DFlashProposer", "DraftModelProposer", "EagleProposer", "HydraProposer", "MedusaProposer", "PromptLookupProposer", "Proposer",
    "SamplingParams", "SpeculativeDecoder", "SpeculativeOutput", "Tree", "TreeShape", "UnsupportedModelError",
    "check_same_tokenizer",
)
__getattr__, __dir__ = lazy_exports(__name__, {**dict.fromkeys(_HEADS, ".heads"), **dict.fromkeys(_INFERENCE, ".inference")})

if TYPE_CHECKING:
    from .heads import (DFlashHeads, Eagle3Head, EagleHead, HeadsConfig, HydraHeads, MedusaHeads, PEagleHead, TargetInfo,
                        load_heads,
                        save_heads)
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
    "PEagleHead",
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
