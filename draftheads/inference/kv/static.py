"""A preallocated ("static") KV cache for the single-sequence loop, so the verify forward can be compiled.

Why: with transformers' `DynamicCache` every verify forward has new shapes (the cache grows by the
tree, `commit` slices it back), so `torch.compile` would recompile every step. Here the cache is
allocated once at a fixed length W (a multiple of `BUCKET`, reused across calls) and never resized:

* prefill runs as today (a `DynamicCache`, the prompt's entries are then copied into slots 0..P-1);
* a verify forward of n tree tokens writes slots prefix..prefix+n-1 (transformers' `StaticLayer`
  writes at its ``cumulative_length``) under OUR additive mask of fixed width [1, 1, n, W]: columns
  below the prefix visible, the tree block = ancestors, every later column masked, so stale
  entries (rejected nodes, an earlier call's tokens) are never read;
* commit = in-place `index_copy_` of the accepted entries to prefix..prefix+m-1 and
  ``cumulative_length = prefix + m``; no slicing.

Every verify forward of a tree of n nodes then has the same shapes, and
``torch.compile(..., dynamic=False)`` compiles once per tree size; compiled forwards pad trees to a
few sizes (`graph_size`) so truncated trees and chains of every length share graphs. The prompt's
KV entries exist twice for a moment after the prefill (the copy). Sliding-window and chunked layers
get a full-length layer and the same window/chunk rules as `tree_attention_mask` (per layer type for
models that mix them), exactly as the dynamic path does.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, StaticLayer

from ..accepted import Acceptance
from ..masks import limiting_spans, shape_on_device, span_masks
from ..tree import Tree, TreeShape
from ..verify import TreeVerifier
from .dynamic import SequenceKV

#: Cache lengths are rounded up to a multiple of this, so that calls with different prompt lengths
#: reuse one cache and one compiled graph per tree size (shapes are part of a compiled graph).
BUCKET = 64
#: Tree slots reserved beyond prompt + max_new_tokens when the proposer's tree size is unknown.
DEFAULT_HEADROOM = 64
#: Graphs one compiled verify forward may hold (one per tree size: prompt lookup and adaptive chains
#: use several); torch's default of 8 would silently fall back to eager beyond it.
RECOMPILE_LIMIT = 64

CACHE_KINDS = ("dynamic", "static")


def bucketed(length: int) -> int:
    return -(-length // BUCKET) * BUCKET


def tree_headroom(proposer: Any) -> int | None:
    """Cache slots a forward may take beyond prompt + max_new_tokens, when the proposer has a static
    tree shape (Medusa, Hydra): its size (a compiled forward pads truncated trees up to it). None
    when unknown (dynamic trees, chains of any length)."""
    shape = getattr(proposer, "shape", None)
    return shape.size if isinstance(shape, TreeShape) else None


def graph_size(n: int, full: int | None) -> int:
    """Tokens of a compiled forward for a tree of ``n`` nodes: the proposer's full static tree size
    when it fits (Medusa's trees truncated near max_new_tokens: one graph), else the next power of
    two (chains of any length: a handful of graphs instead of one per length)."""
    if full is not None and n <= full:
        return full
    return 1 << (n - 1).bit_length()


def padded_block(shape: TreeShape, size: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[size, size] additive mask: the tree's own block, then padding rows that see only themselves
    (their outputs are dropped) and that no tree node sees. Cached on the shape, like its block."""
    key = ("padded", size, device, dtype)
    if key not in shape.on_device:
        n = shape.size
        block = torch.full((size, size), torch.finfo(dtype).min, dtype=dtype, device=device)
        block[:n, :n] = shape_on_device(shape, device, dtype).block
        block[range(n, size), range(n, size)] = 0
        shape.on_device[key] = block
    return shape.on_device[key]


class StaticTreeCache:
    """One sequence's keys and values in fixed-length buffers (transformers' `StaticLayer`, one per
    layer, all full length). ``capacity`` is the number of slots; `fixed` caches refuse to grow."""

    def __init__(self, fixed_length: int | None = None, headroom: int | None = None) -> None:
        self.fixed_length = fixed_length
        self.headroom = headroom  # `tree_headroom` of the proposer
        self.cache: Cache | None = None
        self.capacity = 0

    # -- allocation ---------------------------------------------------------------------------------
    def _allocate(self, like: list[tuple[torch.Tensor, torch.Tensor]], capacity: int) -> None:
        layers = [StaticLayer(max_cache_len=capacity) for _ in like]
        for layer, (keys, values) in zip(layers, like):
            if keys.shape[0] != 1:
                raise ValueError(f"the static cache holds one sequence; got a batch of {keys.shape[0]}")
            layer.lazy_initialization(keys[:, :, :0], values[:, :, :0])  # shapes, dtype, device only
        self.cache = Cache(layers=layers)
        self.capacity = capacity

    def _required(self, needed: int, what: str) -> int:
        """The capacity to allocate for ``needed`` slots, or a clear error for a fixed cache."""
        if self.fixed_length is not None:
            if needed > self.fixed_length:
                raise ValueError(
                    f"{what} needs {needed} cache slots but the static cache was built for max_cache_len="
                    f"{self.fixed_length}: build the SpeculativeDecoder with a larger max_cache_len, or leave it "
                    "None to let the cache grow (each new length compiles new graphs when compile is on)"
                )
            return self.fixed_length
        return bucketed(needed)

    def load(self, prefill: DynamicCache, prefix_len: int, end: int) -> Cache:
        """Copy a prefill's entries into slots 0..prefix_len-1 for a call that ends at ``end`` =
        prompt + max_new_tokens tokens (allocating or growing the buffers if they are too short or of
        another model); the rest of the buffers is stale and masked."""
        entries = [(layer.keys, layer.values) for layer in prefill.layers]
        known = self.headroom is not None
        needed = end + (self.headroom if known else 0 if self.fixed_length is not None else DEFAULT_HEADROOM)
        what = f"prompt ({prefix_len} tokens) + max_new_tokens ({end - prefix_len})" + (" + tree width" if known else "")
        if not self._fits(entries, needed):
            self._allocate(entries, self._required(needed, what))
        for layer, (keys, values) in zip(self.cache.layers, entries):
            layer.keys[:, :, :prefix_len].copy_(keys[:, :, :prefix_len])
            layer.values[:, :, :prefix_len].copy_(values[:, :, :prefix_len])
            layer.cumulative_length.fill_(prefix_len)
        return self.cache

    def _fits(self, entries: list[tuple[torch.Tensor, torch.Tensor]], needed: int) -> bool:
        if self.cache is None or len(self.cache.layers) != len(entries) or self.capacity < needed:
            return False
        return all(
            layer.keys.shape[1:2] + layer.keys.shape[3:] == k.shape[1:2] + k.shape[3:]
            and layer.values.shape[3:] == v.shape[3:]
            and layer.keys.dtype == k.dtype
            and layer.keys.device == k.device
            for layer, (k, v) in zip(self.cache.layers, entries)
        )

    def ensure(self, needed: int, prefix_len: int) -> None:
        """Room for a forward that ends at slot ``needed``: grow (keeping the prefix) if short. A tree
        wider than the headroom planned for it is the only way to get here mid-generation."""
        if needed <= self.capacity:
            return
        old = self.cache
        self._allocate([(layer.keys, layer.values) for layer in old.layers], self._required(needed, "a verify forward"))
        for new, layer in zip(self.cache.layers, old.layers):
            new.keys[:, :, :prefix_len].copy_(layer.keys[:, :, :prefix_len])
            new.values[:, :, :prefix_len].copy_(layer.values[:, :, :prefix_len])
            new.cumulative_length.fill_(prefix_len)

    # -- commit -------------------------------------------------------------------------------------
    def commit(self, prefix_len: int, acc: Acceptance) -> None:
        """Accepted entries move to slots prefix..prefix+m-1 (in place); later slots become stale."""
        m = len(acc.nodes)
        if not acc.contiguous:
            device = self.cache.layers[0].keys.device
            src = prefix_len + acc.index(device)
            dst = torch.arange(prefix_len, prefix_len + m, device=device)
            for layer in self.cache.layers:
                layer.keys.index_copy_(2, dst, layer.keys.index_select(2, src))
                layer.values.index_copy_(2, dst, layer.values.index_select(2, src))
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(prefix_len + m)


class _FixedWidthMask:
    """[1, 1, n, W] additive mask for one tree size over a static cache, kept on the device and
    updated in place: columns < prefix 0, the tree block at prefix..prefix+n-1, the rest masked."""

    def __init__(self, n: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self.buffer = torch.full((n, width), torch.finfo(dtype).min, dtype=dtype, device=device)
        self.placed: int | None = None  # prefix of the last placement

    def place(self, shape: TreeShape, prefix_len: int) -> torch.Tensor:
        n, low = self.buffer.shape[0], torch.finfo(self.buffer.dtype).min
        if self.placed is None or prefix_len < self.placed:
            self.buffer.fill_(low)
            self.buffer[:, :prefix_len] = 0
        else:
            self.buffer[:, self.placed : prefix_len] = 0  # newly committed prefix; later columns stay masked
        self.buffer[:, prefix_len : prefix_len + n] = padded_block(shape, n, self.buffer.device, self.buffer.dtype)
        self.placed = prefix_len
        return self.buffer[None, None]


def _widened(mask: torch.Tensor, shape: TreeShape, prefix_len: int, size: int, width: int) -> torch.Tensor:
    """A [1, 1, n, prefix + n] tree mask as [1, 1, size, width]: the new columns masked, padding
    rows (trees padded to ``size``) seeing only themselves."""
    low = torch.finfo(mask.dtype).min
    mask = torch.nn.functional.pad(mask, (0, width - mask.shape[-1]), value=low)
    pad = size - shape.size
    if pad:
        rows = torch.full((1, 1, pad, width), low, dtype=mask.dtype, device=mask.device)
        rows[0, 0, range(pad), range(prefix_len + shape.size, prefix_len + size)] = 0
        mask = torch.cat([mask, rows], dim=2)
    return mask


class StaticTreeVerifier(TreeVerifier):
    """`TreeVerifier` over a `StaticTreeCache`: fixed-width masks and an optionally compiled forward.

    ``compile``: False (eager), True (``torch.compile`` with the default backend, inductor) or a
    backend name ("eager", "aot_eager", "inductor", ...), always ``dynamic=False``: one graph per
    tree size and cache length; trees are padded to `graph_size` tokens so that truncated trees and
    chains of many lengths share a few graphs. Features come from ``output_hidden_states`` of the tree tokens
    (n rows per layer, cheap) because forward hooks added per call defeat compilation."""

    def __init__(
        self,
        target: torch.nn.Module,
        feature_layers=None,
        compile: bool | str = False,
        max_cache_len: int | None = None,
        headroom: int | None = None,
    ) -> None:
        super().__init__(target, feature_layers=feature_layers)
        self.store = StaticTreeCache(max_cache_len, headroom)
        self._masks: dict[tuple[int, int], _FixedWidthMask] = {}
        self._step: Callable[..., Any] = self._forward_tokens
        self._full = headroom  # the proposer's static tree size, if it has one
        #: Pad trees to `graph_size` (on with compile, where every new size is a new graph).
        self.pad_trees = bool(compile)
        if compile:
            import torch._dynamo.config as dynamo_config

            dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
            backend = "inductor" if compile is True else str(compile)
            self._step = torch.compile(self._forward_tokens, dynamic=False, backend=backend)

    def attention_mask(self, shape: TreeShape, prefix_len: int, size: int | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """[1, 1, size, W] (or one per layer type) for a tree padded to ``size`` tokens (default: none)."""
        size = shape.size if size is None else size
        width = self.store.capacity
        limiting = limiting_spans(self.spans, shape, prefix_len)
        if not limiting:
            key = (size, width)
            if key not in self._masks:
                self._masks[key] = _FixedWidthMask(size, width, self.dtype, self.device)
            return self._masks[key].place(shape, prefix_len)
        # Windows or chunks hide part of the prefix: built as on the dynamic path, then widened (and
        # padding rows see only themselves).
        masks = span_masks(limiting, shape, prefix_len, self.dtype, self.device)
        if isinstance(masks, dict):
            return {name: _widened(mask, shape, prefix_len, size, width) for name, mask in masks.items()}
        return _widened(masks, shape, prefix_len, size, width)

    def _forward_tokens(self, input_ids, position_ids, attention_mask, cache):
        """The part that is compiled: fixed shapes for a given tree size and cache length."""
        out = self.target(
            input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask, use_cache=True,
            output_hidden_states=bool(self.feature_layers), **{self.cache_arg: cache},
        )
        if not self.feature_layers:
            return out.logits, None
        states = out.hidden_states  # index i (0..L) or -1, as in `FeatureTap`
        parts = [states[i] for i in self.feature_layers]
        return out.logits, parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def forward_tree(self, cache: Cache, tree: Tree, prefix_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        n = tree.shape.size
        size = graph_size(n, self._full) if self.pad_trees else n
        self.store.ensure(prefix_len + size, prefix_len)
        device = self.device
        tokens = tree.tokens.to(device, non_blocking=True)
        positions = shape_on_device(tree.shape, device, self.dtype).depth + prefix_len
        if size > n:  # padding: any token, at the root's position; its logits and cache slots are dropped
            tokens = torch.cat([tokens, tokens.new_zeros(size - n)])
            positions = torch.cat([positions, positions.new_full((size - n,), prefix_len)])
        logits, features = self._step(
            tokens[None], positions[None], self.attention_mask(tree.shape, prefix_len, size), self.store.cache
        )
        if size > n:
            tokens, logits, features = tokens[:n], logits[:, :n], None if features is None else features[:, :n]
        return tokens[None], logits, features


class StaticKV(SequenceKV):
    """One sequence in the `StaticTreeCache` of a `StaticTreeVerifier`: the prefill's entries are
    copied into its fixed-length buffers, commits move entries in place (no slicing)."""

    def own_cache(self, prefilled: DynamicCache) -> Cache:
        return self.verifier.store.load(prefilled, self.prefix_len, self.prefix_len + self.max_new_tokens)

    def commit_path(self, acc: Acceptance) -> None:
        self.verifier.store.commit(self.prefix_len, acc)
