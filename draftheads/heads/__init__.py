"""What every head type shares (`DraftHeads`, its config, the heads folder and its safetensors
io); each head type's own module lives with its method, in draftheads/methods/<type>/heads.py."""
from typing import Any

from ..registry import moved
from .base import DraftHeads, check_target
from .config import FORMAT_VERSION, HeadsConfig, TargetInfo
from .io import head_types, load_heads, read_config, save_heads

__all__ = [
    "DraftHeads",
    "FORMAT_VERSION",
    "HeadsConfig",
    "TargetInfo",
    "check_target",
    "head_types",
    "load_heads",
    "read_config",
    "save_heads",
]


def __getattr__(name: str) -> Any:
    """The head classes that lived here (``draftheads.heads.MedusaHeads``): deprecated, found
    through the registry (`registry.moved`)."""
    return moved(__name__, name)
