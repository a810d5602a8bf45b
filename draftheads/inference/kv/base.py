"""The KV store interface: what the decode loop (`inference.loop`) decodes in.

A store owns the target's KV cache for one decode call: it prefills the prompts, runs each step's
verify forward through the verifier over its cache layout, keeps the accepted nodes and drops the
rows that are done. The loop sees only this interface, so one loop serves every layout:

- `dynamic.SequenceKV`: one unpadded row in transformers' dynamic cache (masks over prefix + tree
  only, none at all for chains: the model's own causal fast path);
- `static.StaticKV`: one row in a preallocated cache of fixed length (fixed shapes per tree size,
  so the verify forward can be compiled);
- `ragged.RaggedKV`: a batch in one cache whose rows advance by different amounts (per-row holes).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from ..accepted import Acceptance
from ..tree import Tree


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
    #: A hybrid target's recurrent state after every node (`kv.recurrent.RecurrentStep`), for commit.
    recurrent: Any = None


class KVStore(ABC):
    """The target's cache for the active rows of one decode call (rows are positions in the active
    batch, in order, as the proposer numbers them)."""

    @abstractmethod
    def prefill(self, input_ids: torch.Tensor) -> Prefilled:
        """The prompts ``input_ids`` [rows, T] into the cache."""

    @abstractmethod
    def verify(self, trees: list[Tree]) -> Verified:
        """ONE target forward over the cache and every active row's tree (the cache grows by them)."""

    @abstractmethod
    def commit(self, accs: list[Acceptance]) -> None:
        """Keep each row's accepted nodes (its `Acceptance`) in the cache, drop the rest of its tree."""

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` go on decoding (a single-sequence store never drops its one row)."""

    def tidy(self) -> None:
        """After a step: housekeeping of the layout (e.g. removing holes)."""

    def stats(self) -> dict:
        """Layout figures for the output's ``stats``."""
        return {}
