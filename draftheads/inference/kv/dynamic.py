"""The dynamic store: one unpadded sequence in transformers' `DynamicCache`, and the commit that
keeps a tree's accepted nodes in such a cache."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ..accepted import Acceptance
from ..recurrent import attention_layers, commit_states
from ..tree import Tree
from .base import KVStore, Prefilled, Verified


def commit(cache: DynamicCache, prefix_len: int, path: torch.Tensor | Acceptance) -> None:
    """Keep the prefix and the accepted tree nodes (``path``, relative to the tree, or an
    `Acceptance`) in the cache.

    Entries are moved in place and the layers become views of their first prefix+m slots: no
    full-cache copy (the next forward's concatenation makes the only copy). A layer that already
    holds exactly the prefix and the path is left alone: no view per layer in a plain step. No host
    sync: the contiguity test reads the host copy of the path, the gather uses the device copy."""
    acc = path if isinstance(path, Acceptance) else Acceptance(path, -1)
    m = len(acc.nodes)
    contiguous = acc.contiguous
    sources: dict[torch.device, torch.Tensor] = {}
    end = prefix_len + m
    for layer in attention_layers(cache):  # a hybrid target's state layers: `recurrent.commit_states`
        keys, values = layer.keys, layer.values
        if contiguous and keys.shape[-2] == end and values.shape[-2] == end:
            continue  # the forward appended exactly the accepted nodes (a plain step, a fully accepted chain)
        if not contiguous:
            if keys.device not in sources:
                sources[keys.device] = prefix_len + acc.index(keys.device)
            src = sources[keys.device]
            keys[..., prefix_len : prefix_len + m, :] = keys.index_select(-2, src)
            values[..., prefix_len : prefix_len + m, :] = values.index_select(-2, src)
        layer.keys = keys[..., :end, :]
        layer.values = values[..., :end, :]


class SequenceKV(KVStore):
    """One unpadded sequence: masks over prefix + tree only, none at all for chains (the model's
    own causal fast path). ``verifier`` is a `verify.TreeVerifier`. On a hybrid target the verify
    forward records the recurrent state after every node, and commit keeps the last accepted one's."""

    def __init__(self, verifier, max_new_tokens: int) -> None:
        self.verifier, self.max_new_tokens = verifier, max_new_tokens
        self.cache = None
        self.prefix_len = 0
        self._recorded = None  # the last verify forward's `recurrent.RecurrentStep` (hybrid targets)

    def prefill(self, input_ids: torch.Tensor) -> Prefilled:
        """The prompt ([1, T]) in the cache."""
        prompt = input_ids[0].to(self.verifier.device)
        cache = self.verifier.new_cache()
        last, features = self.verifier.prefill(cache, prompt[None])
        self.prefix_len = prompt.numel()
        self.cache = self.own_cache(cache)
        return Prefilled(last, [prompt], [None if features is None else features[0]])

    def own_cache(self, prefilled: DynamicCache):
        """The cache the steps decode in, from the prefill's: the same one here."""
        return prefilled

    def verify(self, trees: list[Tree]) -> Verified:
        (tree,) = trees
        verified = Verified(*self.verifier.forward_tree(self.cache, tree, self.prefix_len))
        self._recorded = verified.recurrent
        return verified

    def commit(self, accs: list[Acceptance]) -> None:
        (acc,) = accs
        self.commit_path(acc)
        if self._recorded is not None:
            commit_states(self.cache, self._recorded, [acc.nodes[-1]], len(acc.nodes))
            self._recorded = None
        self.prefix_len += len(acc.nodes)

    def commit_path(self, acc: Acceptance) -> None:
        commit(self.cache, self.prefix_len, acc)
