"""When a cache shared by rows that advance unevenly gets its holes removed (one gather of it).

The target's ragged cache (`kv.ragged.RaggedKV`) and EAGLE's batched draft cache
(`proposers.eagle.EagleDrafter`) follow the same policy, passed to the decoder as
``compaction``:
- "never": holes stay masked (attention runs over them);
- "always": whenever there is a hole (no holes, a cache copy per step that made one);
- "auto" (default): when a finished row is dropped (that copy happens anyway) or when holes
  exceed `HOLE_FRACTION` of the cache.
"""
from __future__ import annotations

COMPACTION = ("auto", "never", "always")
HOLE_FRACTION = 0.25


def check_compaction(policy: str, what: str = "compaction") -> str:
    if policy not in COMPACTION:
        raise ValueError(f"{what} must be one of {COMPACTION}, got {policy!r}")
    return policy


def wants_compaction(policy: str, holes: int, slots: int) -> bool:
    """Whether ``holes`` masked slots out of ``slots`` are worth one gather of the cache now."""
    if policy == "always":
        return holes > 0
    return policy == "auto" and holes > HOLE_FRACTION * slots
