"""draftheads: train speculative-decoding draft heads on a frozen Hugging Face LM, decode losslessly.

The public names load on first use (``dh.SpeculativeDecoder`` imports torch and transformers
then), so ``import draftheads`` and the command line's ``--help`` stay fast."""
from typing import TYPE_CHECKING

from .lazy import lazy_exports
from .registry import moved, set_loader


def _register_methods() -> None:
    """Register every drafting method (draftheads/methods/): run by the registry at its first lookup."""
    from . import methods  # noqa: F401


set_loader(_register_methods)

_METHODS = {  # each head type's heads class and drafter, in its method's package
    "MedusaHeads": ".methods.medusa.heads", "MedusaDrafter": ".methods.medusa.drafter",
    "HydraHeads": ".methods.hydra.heads", "HydraDrafter": ".methods.hydra.drafter",
    "EagleHead": ".methods.eagle.heads", "EagleDrafter": ".methods.eagle.drafter",
    "Eagle3Head": ".methods.eagle3.heads",
    "PEagleHead": ".methods.peagle.heads", "PEagleDrafter": ".methods.peagle.drafter",
    "DFlashHeads": ".methods.dflash.heads", "DFlashDrafter": ".methods.dflash.drafter",
    "MtpHead": ".methods.mtp.heads",  # drafts with EagleDrafter
    "DSparkHeads": ".methods.dspark.heads", "DSparkDrafter": ".methods.dspark.drafter",
    "DFlash2Heads": ".methods.dflash2.heads", "DFlash2Drafter": ".methods.dflash2.drafter",
}
_HEADS = ("HeadsConfig", "TargetInfo", "load_heads", "save_heads")
_INFERENCE = ("DraftModelProposer", "Drafter", "PromptLookupProposer", "Proposer", "SamplingParams", "SpeculativeDecoder",
              "SpeculativeOutput", "Tree", "TreeShape", "UnsupportedModelError", "check_same_tokenizer")
_PLANS = ("DynamicTree", "StaticTree")  # the typed tree a decoder drafts (`tree=`) and tree.json holds
_exported, __dir__ = lazy_exports(__name__, {**_METHODS, **dict.fromkeys(_HEADS, ".heads"),
                                             **dict.fromkeys(_INFERENCE, ".inference"), **dict.fromkeys(_PLANS, ".plans")})


def __getattr__(name: str):
    """The public names, loaded on first use; a head drafter's former name (``dh.MedusaProposer``)
    is its drafter, with a DeprecationWarning (`registry.moved`, the one path of the old names)."""
    try:
        return _exported(name)
    except AttributeError:
        if name.endswith("Proposer"):
            return moved(__name__, name)
        raise


if TYPE_CHECKING:
    from .heads import HeadsConfig, TargetInfo, load_heads, save_heads
    from .inference import (DraftModelProposer, Drafter, PromptLookupProposer, Proposer, SamplingParams, SpeculativeDecoder,
                            SpeculativeOutput, Tree, TreeShape, UnsupportedModelError, check_same_tokenizer)
    from .methods.dflash.drafter import DFlashDrafter
    from .methods.dflash.heads import DFlashHeads
    from .methods.dflash2.drafter import DFlash2Drafter
    from .methods.dflash2.heads import DFlash2Heads
    from .methods.dspark.drafter import DSparkDrafter
    from .methods.dspark.heads import DSparkHeads
    from .methods.eagle.drafter import EagleDrafter
    from .methods.eagle.heads import EagleHead
    from .methods.eagle3.heads import Eagle3Head
    from .methods.hydra.drafter import HydraDrafter
    from .methods.hydra.heads import HydraHeads
    from .methods.medusa.drafter import MedusaDrafter
    from .methods.medusa.heads import MedusaHeads
    from .methods.mtp.heads import MtpHead
    from .methods.peagle.drafter import PEagleDrafter
    from .methods.peagle.heads import PEagleHead
    from .plans import DynamicTree, StaticTree

__version__ = "0.1.0"

__all__ = [
    "DFlash2Drafter",
    "DFlash2Heads",
    "DFlashDrafter",
    "DFlashHeads",
    "DSparkDrafter",
    "DSparkHeads",
    "DraftModelProposer",
    "Drafter",
    "DynamicTree",
    "Eagle3Head",
    "EagleDrafter",
    "EagleHead",
    "HeadsConfig",
    "HydraDrafter",
    "HydraHeads",
    "MedusaDrafter",
    "MedusaHeads",
    "MtpHead",
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
