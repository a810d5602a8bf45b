"""Draft heads (Medusa today), their config, and their safetensors export."""
from .config import FORMAT_VERSION, HeadsConfig, TargetInfo
from .io import head_types, load_heads, read_config, save_heads
from .medusa import MedusaHeads, ResBlock, check_target

__all__ = [
    "FORMAT_VERSION",
    "HeadsConfig",
    "MedusaHeads",
    "ResBlock",
    "TargetInfo",
    "check_target",
    "head_types",
    "load_heads",
    "read_config",
    "save_heads",
]
