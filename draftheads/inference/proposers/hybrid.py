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

Prompt lookup's copies have a draft budget of their own (`draft_budget.PerSourceBudget`, which
the decoder hands over with `use_budget`): a copy is capped by what copies have earned, down to a
plain step on text whose copies fail. One budget for lookup and the heads together went plain
where the heads did not pay, and lookup's copies went undrafted with them. The heads draft as the
plan chose, without a budget: the plan timed their chain against plain steps at the request's
temperature, and a budget of their own (``budget_sources`` with "heads", or an explicit
`PerSourceBudget`) judged a chain of one, near break-even, plain on most steps and ran no faster
on SmolLM2 than drafting it always (docs/results.md, hybrid-budget runs).
"""
from __future__ import annotations

import torch

from ..tree import Tree, chain_shape
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
        self._budget = None  # a `draft_budget.PerSourceBudget` (see `use_budget`), or no caps

    budget_sources = ("lookup",)  # the heads' rows draft as the plan chose (module docstring)

    def use_budget(self, budget) -> None:
        self._budget = budget

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
        copy_rows = [r for r, copy in enumerate(use_copy) if copy]
        head_rows = [r for r, copy in enumerate(use_copy) if not copy]
        depths = [0] * len(roots)  # what the heads may draft: nothing for a copied row
        budget = self._budget
        if budget is not None and copy_rows:
            caps = budget.cap("lookup", [copied[r].shape.size - 1 for r in copy_rows])
            for r, cap in zip(copy_rows, caps):
                copied[r] = Tree(chain_shape(cap), copied[r].tokens[: cap + 1])  # a copy is a chain: its prefix
            budget.routed("lookup", copy_rows, max(caps))
        head_caps = [max_depths[r] for r in head_rows]
        if budget is not None and head_rows:
            head_caps = budget.cap("heads", head_caps)
        for r, depth in zip(head_rows, head_caps):
            depths[r] = depth
        drafted = self.heads.propose(roots, depths)
        if budget is not None and head_rows:
            budget.routed("heads", head_rows, max(drafted[r].shape.max_depth for r in head_rows))
        for r in copy_rows:
            self._steps["lookup"] += copied[r].shape.size > 1
        for r in head_rows:
            self._steps["heads"] += drafted[r].shape.size > 1  # heads whose tree drafts nothing leave lookup alone
        return [copied[r] if use_copy[r] else drafted[r] for r in range(len(roots))]

    def accepted(self, tokens, hidden) -> None:
        self.heads.accepted(tokens, hidden)
        self.lookup.accepted(tokens, [None] * len(tokens))

    def keep(self, rows: list[int]) -> None:
        self.heads.keep(rows)
        self.lookup.keep(rows)

    def stats(self) -> dict:
        # "lookup": what lookup matched and offered, before the copies' budget cut it;
        # "drafted_by": the steps each source really drafted.
        return {**self.heads.stats(), "lookup": self.lookup.stats(),
                "drafted_by": dict(self._steps)}
