"""Prompt lookup first, heads otherwise: one drafter that takes, row by row and step by step, the
draft of whichever source has something to say.

The two are good at different text. Prompt lookup copies: when the output repeats its input or
itself (extraction, code edits, quoted context, lists), a copied run is accepted many tokens deep
and costs no model at all; everywhere else it has no match and drafts nothing. Heads predict: they
draft a token or two on any text, but rarely more than that on a small real target. So each
step, for each row, a lookup match (of at least 2 tokens by default) drafts that row (a copied
chain, up to the lookup's ``num_tokens`` deep), and the heads draft every other row.

The heads still see every committed token: a row the lookup drafted asks its heads for a
root-only step (depth 0), exactly as a plain step of the draft budget does, so the heads' caches
and pending features catch up on their next drafting step. Which source drafts a row depends
only on the committed text (the lookup's match), never on what the target will say, so decoding
stays lossless; copied drafts are point masses to the verifier, the heads' trees or drawn chains
keep their own laws.
"""
from __future__ import annotations

import torch

from ..tree import Tree
from .drafter import Drafter
from .prompt_lookup import PromptLookupProposer
from .sequence import ForkedRows


class LookupThenHeads(Drafter):
    """``heads`` (a head drafter) behind prompt lookup: a row whose suffix matches an earlier n-gram
    (n from ``lookup``'s ``max_ngram`` down to its ``min_ngram``; by default 3 down to 2, as a single
    token's last occurrence predicts little) drafts the copy, up to ``lookup``'s ``num_tokens``; the
    others draft with ``heads`` (module docstring)."""

    def __init__(self, heads: Drafter, lookup: PromptLookupProposer | None = None) -> None:
        lookup = lookup if lookup is not None else PromptLookupProposer(max_ngram=3, min_ngram=2)
        if not isinstance(lookup, PromptLookupProposer):
            raise TypeError(f"lookup must be a PromptLookupProposer, got {type(lookup).__name__}")
        self.heads = heads
        self.lookup = ForkedRows(lookup)
        self.feature_layers = heads.feature_layers  # the lookup reads tokens only
        self._steps = {"lookup": 0, "heads": 0}

    @property
    def name(self) -> str:
        return f"{self.heads.name}+PromptLookup"

    def bind_target(self, target: torch.nn.Module) -> None:
        self.heads.bind_target(target)

    def use_compaction(self, policy: str) -> None:
        self.heads.use_compaction(policy)

    def start(self, prompts, hidden, params, generator) -> None:
        self.heads.start(prompts, hidden, params, generator)
        self.lookup.start(prompts, [None] * len(prompts), params, generator)
        self._steps = {"lookup": 0, "heads": 0}

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        copied = self.lookup.propose(roots, max_depths)
        use_copy = [tree.shape.size > 1 for tree in copied]  # the lookup matched: a copy to draft
        drafted = self.heads.propose(roots, [0 if copy else d for copy, d in zip(use_copy, max_depths)])
        for copy, depth, own in zip(use_copy, max_depths, drafted):
            if copy:
                self._steps["lookup"] += 1
            elif depth > 0 and own.shape.size > 1:  # heads whose tree drafts nothing leave lookup alone
                self._steps["heads"] += 1
        return [c if copy else h for copy, c, h in zip(use_copy, copied, drafted)]

    def accepted(self, tokens, hidden) -> None:
        self.heads.accepted(tokens, hidden)
        self.lookup.accepted(tokens, [None] * len(tokens))

    def keep(self, rows: list[int]) -> None:
        self.heads.keep(rows)
        self.lookup.keep(rows)

    def stats(self) -> dict:
        return {**self.heads.stats(), "lookup": self.lookup.stats(),
                "drafted_by": dict(self._steps)}
