"""draftheads: train speculative-decoding draft heads on a frozen Hugging Face LM, decode losslessly."""
from .heads import HeadsConfig, MedusaHeads, TargetInfo, load_heads, save_heads

__version__ = "0.1.0"

__all__ = ["HeadsConfig", "MedusaHeads", "TargetInfo", "load_heads", "save_heads", "__version__"]
