"""Prompt lookup: draft by copying what followed the last n tokens the previous time they occurred.

No model: the "draft" is the text itself (prompt and generated so far). Pays off when the output
repeats its input (code edits, summaries, RAG answers quoting the context) or itself (loops).
Drafts are deterministic, so the verifier treats them as point masses and stays lossless.

Lookup is O(1) per step: for every n in [min_ngram, max_ngram] a dict maps an n-gram to the
position right after its most recent occurrence that has a continuation. It is updated as tokens
are committed, so a step never rescans the sequence (cf. transformers' prompt lookup, which
unfolds the whole sequence every step and takes the earliest match). A continuation that reaches
the end of the text is extended by overlapping copy (see `lookup`).
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree import Tree, chain_shape
from .sequence import Proposer


class PromptLookupProposer(Proposer):
    """Chain of up to ``num_tokens`` tokens copied after the most recent earlier occurrence of the
    longest suffix n-gram (n from ``max_ngram`` down to ``min_ngram``); no match = root only.

    ``min_ngram`` defaults to 2, as behind the heads (`LookupThenHeads`): where a single token's
    last occurrence was the only match, a real chat model's text rarely went on as it did before,
    and ten-token drafts from such matches, accepted 1-3% of the time, cost more than the draft
    budget won back on short answers (measured on SmolLM2, docs/results.md). ``min_ngram=1``
    matches down to one token, as transformers' prompt lookup does."""

    feature_layers = ()  # tokens only: the verifier captures no hidden state

    def __init__(self, max_ngram: int = 3, num_tokens: int = 10, min_ngram: int = 2) -> None:
        if min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {min_ngram}")
        if max_ngram < min_ngram:
            raise ValueError(f"max_ngram ({max_ngram}) must be >= min_ngram ({min_ngram})")
        if num_tokens < 1:
            raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
        self.max_ngram, self.min_ngram, self.num_tokens = max_ngram, min_ngram, num_tokens
        self._tokens: list[int] = []
        # _next[n][ngram] = j: tokens[j - n : j] == ngram, and tokens[j] exists (latest such j)
        self._next: dict[int, dict[tuple[int, ...], int]] = {}
        self._root_pending = False
        self._reset_stats()

    def _reset_stats(self) -> None:
        self._steps = 0
        self._matched = 0
        self._drafted = 0
        self._accepted = 0
        self._ngram_hist: dict[int, int] = {}

    def _append(self, token: int) -> None:
        """Commit one token: every n-gram ending just before it now has it as continuation."""
        j = len(self._tokens)
        self._tokens.append(token)
        for n in range(self.min_ngram, self.max_ngram + 1):
            if j >= n:
                self._next[n][tuple(self._tokens[j - n : j])] = j

    # -- Proposer --------------------------------------------------------------------------------
    def start(self, input_ids: torch.Tensor, hidden: torch.Tensor | None, params: SamplingParams, generator) -> None:
        self._tokens = []
        self._next = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}
        self._root_pending = False
        self._reset_stats()
        for token in input_ids.reshape(-1).tolist():
            self._append(int(token))

    def lookup(self, max_tokens: int) -> tuple[list[int], int]:
        """Continuation of the longest matching suffix n-gram (and that n); ``([], 0)`` if none."""
        tokens = self._tokens
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(tokens) <= n:
                continue  # the suffix itself is the only n-gram: nothing earlier to match
            j = self._next[n].get(tuple(tokens[-n:]))
            if j is not None:
                # Copy what followed, LZ77-style: a copy that runs into the end of the text goes on
                # copying its own start, so a repetition of period p (the typical case, and its
                # most recent occurrence is p tokens back) still yields a full-length draft, not
                # just p tokens (truncated copies draft too little on repetitive text).
                end = len(tokens)
                draft = tokens[j : j + max_tokens]
                while len(draft) < max_tokens:
                    draft.append(draft[j + len(draft) - end])
                return draft, n
        return [], 0

    def propose(self, root: int, max_depth: int) -> Tree:
        if self._root_pending:
            raise RuntimeError("propose() called twice without accepted(): the decode loop is out of step")
        # The root is decided: it is committed whatever the verifier says, so it joins the text now.
        self._append(int(root))
        self._root_pending = True
        self._steps += 1
        draft, n = self.lookup(min(self.num_tokens, max_depth)) if max_depth > 0 else ([], 0)
        if draft:
            self._matched += 1
            self._drafted += len(draft)
            self._ngram_hist[n] = self._ngram_hist.get(n, 0) + 1
        return Tree(chain_shape(len(draft)), torch.tensor([root, *draft], dtype=torch.long))

    def accepted(self, tokens: torch.Tensor, hidden: torch.Tensor | None = None) -> None:
        tokens = tokens.reshape(-1).tolist()
        if not self._root_pending or not tokens or tokens[0] != self._tokens[-1]:
            raise RuntimeError("accepted() does not follow propose(): the decode loop is out of step")
        self._root_pending = False
        self._accepted += len(tokens) - 1
        for token in tokens[1:]:
            self._append(int(token))

    def stats(self) -> dict:
        return {
            "proposer": "prompt_lookup",
            "lookup_steps": self._steps,
            "lookup_match_rate": self._matched / max(self._steps, 1),
            "lookup_mean_draft_len": self._drafted / max(self._matched, 1),
            "lookup_accept_rate": self._accepted / max(self._drafted, 1),
            "lookup_ngram_histogram": dict(sorted(self._ngram_hist.items())),
        }
