"""DSpark drafting: DFlash's one block forward, then the Markov head left to right.

Each step runs the block ``[root, mask x (B-1)]`` once, exactly as `DFlashDrafter` does (the
context cache, the batch in one forward), and reads the draft slots' base logits. Draft d's
scores are then ``base[d] + W2 W1[token at d-1]`` (the root for d = 1): the chain takes each
slot's best token given the one before (what vLLM's DSpark speculator drafts greedily), a static
tree of rank paths reads each node's candidates off its parent's token (`proposers.chained`), and
a sampling request draws each depth from its conditional law. The rest of DFlash's drafter is
unchanged: the draft vocabulary (the LM head's rows, and the Markov projection's rows of the same
ids), rows leaving the batch, calibrate's measurements.

The confidence head scores every drafted token of a chain from its slot's state and the Markov
embedding of the token before it; `acceptance_estimates` hands the decode loop their running
product (the estimated chance that at least j drafts are accepted), which the draft budget turns
into how many drafts a step verifies (`inference/draft_budget.py`). Trees get none: the head
estimates a slot's drafted token, not a sibling's.
"""
from __future__ import annotations

import torch

from ...inference.proposers.chained import ChainedDrafter, SlotScores
from ...inference.tree import Tree
from ..dflash.drafter import DFlashDrafter


class DSparkDrafter(DFlashDrafter, ChainedDrafter):
    """DFlash's block forward with DSpark's sequential Markov stage and confidence estimates."""

    def __init__(self, heads: torch.nn.Module, tree=None, draft_vocab_size: int | None = None) -> None:
        super().__init__(heads, tree=tree, draft_vocab_size=draft_vocab_size)
        rows = None if self.vocab_ids is None else self.vocab_ids.to(heads.markov_head.markov_w2.weight.device)
        self._markov_rows = rows  # the Markov projection's rows of the draft vocabulary
        self._confidence: torch.Tensor | None = None  # [rows, D] this step's chain confidences
        self._conf_rows: list[tuple[int, int]] = []  # (row, its depth) of the chains drafted

    def describe(self, forwards: int) -> dict:
        return {"dspark": {**super().describe(forwards)["dflash"], "markov_rank": self.heads.markov_rank}}

    def scores(self, roots: list[int], depths: list[int]) -> SlotScores:
        """The ONE block forward: every row's draft-slot states and their base logits."""
        states = self.draft_states(roots, depths)
        return SlotScores({"states": states, "base": self.logits(states)})

    def step_scores(self, slots: SlotScores, rows: torch.Tensor, depth: int, previous: torch.Tensor) -> torch.Tensor:
        base = slots["base"][rows, depth - 1]
        scores = base + self.heads.markov_bias(previous, self._markov_rows).to(base.dtype)
        if self._confidence is not None:  # the chain's confidence of this depth (a tree's nodes get none)
            states = slots["states"][rows, depth - 1]
            self._confidence[rows, depth - 1] = torch.sigmoid(self.heads.confidence_logits(states, previous))
        return scores

    @torch.inference_mode()
    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        drafting = [r for r, d in enumerate(max_depths) if self.layout(d).shape.size > 1]
        chain = self.heads.confidence_head is not None and self._is_chain() and drafting
        self._conf_rows = [(r, self.layout(max_depths[r]).shape.max_depth) for r in drafting] if chain else []
        self._confidence = None
        if chain:
            depth = max(d for _, d in self._conf_rows)
            self._confidence = torch.ones(len(drafting), depth, device=self.device)
        return super().propose(roots, max_depths)

    def _is_chain(self) -> bool:
        return self._params.draws_drafts or self.shape.size == self.shape.max_depth + 1

    def acceptance_estimates(self) -> list[list[float]] | None:
        """Per row of the last `propose`, the estimated probability that at least j of its drafts
        are accepted, j = 1..its depth (the running product of the confidences); [] for a row that
        did not draft; None when it drafted a tree or the heads have no confidence head."""
        if self._confidence is None:
            return None
        survival = self._confidence.cumprod(-1).tolist()  # the one host read it costs
        out: list[list[float]] = [[] for _ in range(len(self._ids))]
        for (row, depth), values in zip(self._conf_rows, survival):
            out[row] = values[:depth]
        return out
