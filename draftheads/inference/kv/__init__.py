"""The KV stores the decode loop decodes in, behind one interface (`base.KVStore`): dynamic (one
row, transformers' dynamic cache), static (one row, a preallocated cache for compiled forwards)
and ragged (a batch with per-row holes)."""
from .base import KVStore, Prefilled, Verified
from .dynamic import SequenceKV, commit
from .ragged import RaggedKV
from .static import CACHE_KINDS, StaticKV, StaticTreeVerifier, tree_headroom

__all__ = ["CACHE_KINDS", "KVStore", "Prefilled", "RaggedKV", "SequenceKV", "StaticKV", "StaticTreeVerifier",
           "Verified", "commit", "tree_headroom"]
