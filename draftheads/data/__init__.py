"""Datasets -> tokenized examples with assistant-only (chat) or all-token (text) loss masks."""

from .collate import Collator
from .config import DataConfig
from .load import load_raw_dataset
from .tokenize import DataStats, build_datasets, tokenize_chat, tokenize_text

__all__ = [
    "Collator",
    "DataConfig",
    "DataStats",
    "build_datasets",
    "load_raw_dataset",
    "tokenize_chat",
    "tokenize_text",
]
