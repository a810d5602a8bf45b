"""What the target's KV cache keeps after a verify forward, and the one-sequence KV store.

A KV store is what the decode loop (`loop.py`) decodes in: it prefills the prompts, runs each
step's verify forward through the verifier, keeps the accepted nodes and drops finished rows.
Two stores share that interface: `SequenceKV` (one unpadded row, in the verifier's own cache:
transformers' dynamic cache, or the fixed-length one of `static_cache.StaticTreeVerifier`) and
`ragged.RaggedKV` (a batch, one cache with per-row holes).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .accept import Acceptance
from .tree import Tree


@dataclass
class Prefilled:
    """What the loop needs from a prefill: per row the last prompt logits [rows, V], the prompt on
    the device and the target's features at its positions (None when the proposer reads none)."""

    last_logits: torch.Tensor
    prompts: list[torch.Tensor]
    hidden: list[torch.Tensor | None]


@dataclass
class Verified:
    """One step's verify forward: the tokens as verified [rows, n] (on the logits' device, trees
    padded to n), logits [rows, n, V] and features [rows, n, F] (or None)."""

    tokens: torch.Tensor
    logits: torch.Tensor
    features: torch.Tensor | None


def commit(cache: DynamicCache, prefix_len: int, path: torch.Tensor | Acceptance) -> None:
    """Keep the prefix and the accepted tree nodes (``path``, relative to the tree, or an
    `Acceptance`) in the cache.

    Entries are moved in place and the layers become views of their first prefix+m slots: no
    full-cache copy (the next forward's concatenation makes the only copy). No host sync: the
    contiguity test reads the host copy of the path, the gather uses the device copy."""
    acc = path if isinstance(path, Acceptance) else Acceptance(path, -1)
    m = len(acc.nodes)
    contiguous = acc.contiguous
    sources: dict[torch.device, torch.Tensor] = {}
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        if not contiguous:
            if keys.device not in sources:
                sources[keys.device] = prefix_len + acc.index(keys.device)
            src = sources[keys.device]
            keys[..., prefix_len : prefix_len + m, :] = keys.index_select(-2, src)
            values[..., prefix_len : prefix_len + m, :] = values.index_select(-2, src)
        layer.keys = keys[..., : prefix_len + m, :]
        layer.values = values[..., : prefix_len + m, :]


class SequenceKV:
    """One unpadded sequence in the verifier's cache: masks over prefix + tree only, none at all
    for chains (the model's own causal fast path)."""

    def __init__(self, verifier, max_new_tokens: int) -> None:
        self.verifier, self.max_new_tokens = verifier, max_new_tokens
        self.cache = None
        self.prefix_len = 0

    def prefill(self, input_ids: torch.Tensor) -> Prefilled:
        """The prompt ([1, T]) in the cache."""
        prompt = input_ids[0].to(self.verifier.device)
        cache = DynamicCache()
        last, features = self.verifier.prefill(cache, prompt[None])
        # The static cache copies the prompt's entries into its own preallocated buffers.
        self.prefix_len = prompt.numel()
        self.cache = self.verifier.own_cache(cache, self.prefix_len, self.prefix_len + self.max_new_tokens)
        return Prefilled(last, [prompt], [None if features is None else features[0]])

    def verify(self, trees: list[Tree]) -> Verified:
        (tree,) = trees
        logits, features = self.verifier.forward(self.cache, tree, self.prefix_len)
        return Verified(tree.tokens[None], logits[None], None if features is None else features[None])

    def commit(self, accs: list[Acceptance]) -> None:
        (acc,) = accs
        self.verifier.commit(self.cache, self.prefix_len, acc)
        self.prefix_len += len(acc.nodes)

    def keep(self, rows: list[int]) -> None:
        """Rows leave only when the sequence is done: nothing to drop."""

    def tidy(self) -> None:
        """No holes to remove."""

    def stats(self) -> dict:
        return {}
