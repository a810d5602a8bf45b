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
    "DFlashDrafter", "DraftModelProposer", "Drafter", "EagleDrafter", "HydraDrafter", "MedusaDrafter", "PEagleDrafter",
    "PromptLookupProposer", "Proposer",
    # deprecated names of the head drafters: they warn and build the drafter
    "DFlashProposer", "EagleProposer", "HydraProposer", "MedusaProposer",
    "SamplingParams", "SpeculativeDecoder", "SpeculativeOutput", "Tree", "TreeShape", "UnsupportedModelError",
    "check_same_tokenizer",
)
_PLANS = ("DynamicTree", "StaticTree")  # the typed tree a decoder drafts (`tree=`) and tree.json holds
__getattr__, __dir__ = lazy_exports(__name__, {**dict.fromkeys(_HEADS, ".heads"), **dict.fromkeys(_INFERENCE, ".inference"),
                                               **dict.fromkeys(_PLANS, ".plans")})

if TYPE_CHECKING:
    from .heads import (DFlashHeads, Eagle3Head, EagleHead, HeadsConfig, HydraHeads, MedusaHeads, PEagleHead, TargetInfo,
                        load_heads,
                        save_heads)
    from .inference import (
        DFlashDrafter,
        DFlashProposer,
        DraftModelProposer,
        Drafter,
        EagleDrafter,
        EagleProposer,
        HydraDrafter,
        HydraProposer,
        MedusaDrafter,
        MedusaProposer,
        PEagleDrafter,
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
    from .plans import DynamicTree, StaticTree

__version__ = "0.1.0"

__all__ = [
    "DFlashDrafter",
    "DFlashHeads",
    "DFlashProposer",
    "DraftModelProposer",
    "Drafter",
    "DynamicTree",
    "Eagle3Head",
    "EagleDrafter",
    "EagleHead",
    "EagleProposer",
    "HeadsConfig",
    "HydraDrafter",
    "HydraHeads",
    "HydraProposer",
    "MedusaDrafter",
    "MedusaHeads",
    "MedusaProposer",
    "PEagleDrafter",
    "PEagleHead",
    "PromptLookupProposer",
    "Proposer",
    "SamplingParams",
    "SpeculativeDecoder",
    "SpeculativeOutput",
    "StaticTree",
    "TargetInfo",
    "Tree",
    "TreeShape",
    "UnsupportedModelError",
    "check_same_tokenizer",
    "load_heads",
    "save_heads",
    "__version__",
]
