"""DFlash2 drafting: DFlash's one block forward, then the candidate selector left to right.

Each step runs the block exactly as `DFlashDrafter` does and keeps, per draft slot, the top
``selector_top_k`` candidates of its unary logits. Draft d's scores are then the selector's:
``unary[c] + <A[prev] * P h_d, B[c]>`` over those candidates, -inf elsewhere, with ``prev`` the
token drafted at d-1 (the root for d = 1): the chain is vLLM's greedy walk
(vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py), a static tree of rank paths reads each
node's candidates off its own parent (`proposers.chained`), and a sampling request draws each
depth from the softmax of those scores (the request's temperature, top-k and top-p applied), the
law the verifier then gets for the node: as vLLM's sampled walk, lossless.

The selector ranks only its K candidates: a tree rank must be below K. DFlash2 scores the target's
whole vocabulary (vLLM's and speculators' contract): a draft vocabulary is refused.
"""
from __future__ import annotations

import torch

from ...inference.proposers.chained import ChainedDrafter, SlotScores
from ..dflash.drafter import DFlashDrafter


class DFlash2Drafter(DFlashDrafter, ChainedDrafter):
    """DFlash's block forward with DFlash2's convolution (in the heads' layers) and candidate selector."""

    def __init__(self, heads: torch.nn.Module, tree=None, draft_vocab_size: int | None = None) -> None:
        if draft_vocab_size is not None and draft_vocab_size < heads.config.vocab_size:
            raise ValueError(
                f"dflash2 heads rank the target's whole vocabulary (their selector's codebooks cover it, as vLLM and "
                f"speculators require): draft_vocab_size={draft_vocab_size} does not apply to them"
            )
        super().__init__(heads, tree=tree)
        rank = max(self.shape.ranks[1:], default=-1)
        if rank >= heads.selector_top_k:
            raise ValueError(f"the tree takes rank {rank}, but these dflash2 heads' selector keeps {heads.selector_top_k} "
                             f"candidates per slot (selector_top_k): ranks are 0..{heads.selector_top_k - 1}")

    def describe(self, forwards: int) -> dict:
        return {"dflash2": {**super().describe(forwards)["dflash"], "selector_top_k": self.heads.selector_top_k}}

    def scores(self, roots: list[int], depths: list[int]) -> SlotScores:
        """The ONE block forward: every row's draft-slot states and their top-K unary candidates."""
        states = self.draft_states(roots, depths)
        unary, candidates = self.logits(states).topk(self.heads.selector_top_k, dim=-1)
        return SlotScores({"states": states, "unary": unary, "candidates": candidates})

    def step_scores(self, slots: SlotScores, rows: torch.Tensor, depth: int, previous: torch.Tensor) -> torch.Tensor:
        candidates = slots["candidates"][rows, depth - 1]
        scored = self.heads.candidate_scores(slots["states"][rows, depth - 1], slots["unary"][rows, depth - 1], previous,
                                             candidates)
        out = torch.full((candidates.shape[0], self.vocab_size), float("-inf"), device=scored.device, dtype=scored.dtype)
        return out.scatter_(1, candidates, scored)
