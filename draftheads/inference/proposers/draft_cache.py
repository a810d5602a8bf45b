"""The draft KV cache every draft-layer proposer keeps: preallocated per-layer key/value buffers
[rows, kv heads, slots, head dim] that grow by doubling, so a step never reallocates them."""
from __future__ import annotations

from typing import Callable

import torch

DraftCache = list[tuple[torch.Tensor, torch.Tensor]]


def grown(cache: DraftCache | None, used: int, need: int, new_cache: Callable[[int], DraftCache]) -> DraftCache:
    """``cache`` with room for ``need`` slots (itself when it has them): otherwise new buffers from
    ``new_cache(capacity)`` of at least twice the old capacity, the ``used`` slots copied over."""
    have = 0 if cache is None else cache[0][0].shape[2]
    if need <= have:
        return cache
    new = new_cache(max(need, 2 * have))
    if cache is not None and used:
        for (nk, nv), (ok, ov) in zip(new, cache):
            nk[:, :, :used] = ok[:, :, :used]
            nv[:, :, :used] = ov[:, :, :used]
    return new
