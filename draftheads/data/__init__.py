"""Datasets -> tokenized examples with assistant-only (chat) or all-token (text) loss masks."""

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .collate import Collator
    from .config import DataConfig
    from .load import load_raw_dataset
    from .tokenize import DataStats, build_datasets, tokenize_chat, tokenize_text

# loaded on first use: datasets and torch take seconds to import, the command line's help none
__getattr__, __dir__ = lazy_exports(__name__, {
    "Collator": ".collate", "DataConfig": ".config", "load_raw_dataset": ".load",
    **dict.fromkeys(("DataStats", "build_datasets", "tokenize_chat", "tokenize_text"), ".tokenize"),
})

__all__ = [
    "Collator",
    "DataConfig",
    "DataStats",
    "build_datasets",
    "load_raw_dataset",
    "tokenize_chat",
    "tokenize_text",
]
