"""Draft heads (Medusa, Hydra, EAGLE, EAGLE-3, P-EAGLE, DFlash), their config, and their safetensors export."""
from .base import DraftHeads, check_target
from .config import FORMAT_VERSION, HeadsConfig, TargetInfo
from .io import head_types, load_heads, read_config, save_heads
from .dflash import DFlashHeads
from .eagle import Eagle3Head, EagleHead
from .hydra import HydraHeads
from .medusa import MedusaHeads, ResBlock
from .peagle import PEagleHead

__all__ = [
    "DFlashHeads",
    "DraftHeads",
    "Eagle3Head",
    "EagleHead",
    "HydraHeads",
    "FORMAT_VERSION",
    "HeadsConfig",
    "MedusaHeads",
    "PEagleHead",
    "ResBlock",
    "TargetInfo",
    "check_target",
    "head_types",
    "load_heads",
    "read_config",
    "save_heads",
]
