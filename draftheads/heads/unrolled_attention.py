"""Attention of training's unrolled draft steps, computed tile by tile instead of through one mask.

Step k of EAGLE's training-time test attends, for row t, to the real prefix (step-0 rows s..t of
t's document, s its first row) and to row t of each earlier step 1..k-1's keys. As one dense mask
that is a [n, (k+1) n] attention per step, almost all of it masked out: the prefix is causal (half
of it is zeros) and each earlier step contributes a diagonal. A fused attention kernel given an
explicit mask computes every masked entry anyway, so step k costs (k+1) n^2 where it needs about
n^2 / 2 + k n, and a packed window of several documents pays the whole window^2 where it needs the
sum of its documents' squares.

Here the queries are cut into tiles of ``TILE`` rows (wider past ``MAX_TILES`` tiles: autograd keeps
every tile's key and value slices, about n^2 / (2 x tile) rows in all, so the tile grows with n). A tile [a, b) reads the prefix keys from
the earliest document start of its rows (over the batch) up to b, and only rows a..b of each
earlier step, with the dense mask's entries for exactly those keys: every key a row may see is
in its tile's slice, so each row's softmax runs over the same visible keys as with the dense mask
(equal up to the summation order of the kernel). Used only by training (drafting masks are trees
over a cache and go through the dense path).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

TILE = 128  # query rows per tile: small enough to skip most of a causal mask, large for the kernel
MAX_TILES = 8  # longer windows get wider tiles: each tile's key slice is kept for backward


def first_visible(prefix: torch.Tensor) -> list[int]:
    """[n] on the host: for each query row, the first prefix key any batch row lets it see (one
    read-back per batch; the steps share it)."""
    n = prefix.shape[-1]
    cols = torch.arange(n, device=prefix.device)
    return torch.where(prefix.any(0), cols, n).amin(-1).tolist()


class UnrolledStepMask:
    """Step ``k``'s attention over keys laid out as [prefix (n) | step 1 (n) | ... | step k (n)].

    ``prefix`` [B, n, n] bool: who sees whom among the step-0 rows (causal, within a document,
    real tokens); ``starts`` [n]: the first prefix row any batch row's query t may see (the
    earliest document start over the batch), on the host."""

    def __init__(self, prefix: torch.Tensor, k: int, starts: list[int] | None = None, tile: int | None = None) -> None:
        self.n = prefix.shape[-1]
        self.prefix, self.k = prefix, k
        self.tile = max(TILE, -(-self.n // MAX_TILES)) if tile is None else tile
        self.starts = first_visible(prefix) if starts is None else starts

    def dense(self) -> torch.Tensor:
        """The same attention as one [B, n, (k+1) n] mask (what a drafting mask looks like)."""
        eye = torch.eye(self.n, dtype=torch.bool, device=self.prefix.device)[None].expand_as(self.prefix)
        return torch.cat([self.prefix] + [eye] * self.k, dim=-1)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, enable_gqa: bool) -> torch.Tensor:
        """``q`` [B, h, n, hd], ``keys``/``values`` [B, kv, (k+1) n, hd] -> [B, h, n, hd]."""
        n, out = self.n, []
        for a in range(0, n, self.tile):
            b = min(a + self.tile, n)
            s = min(min(self.starts[a:b]), a)
            slices = [slice(s, b)] + [slice(j * n + a, j * n + b) for j in range(1, self.k + 1)]
            tile_keys = torch.cat([keys[:, :, sl] for sl in slices], 2)
            tile_values = torch.cat([values[:, :, sl] for sl in slices], 2)
            eye = torch.eye(b - a, dtype=torch.bool, device=q.device)[None].expand(q.shape[0], -1, -1)
            mask = torch.cat([self.prefix[:, a:b, s:b]] + [eye] * self.k, dim=-1)
            out.append(F.scaled_dot_product_attention(q[:, :, a:b], tile_keys, tile_values, attn_mask=mask[:, None],
                                                      enable_gqa=enable_gqa))
        return torch.cat(out, 2)
