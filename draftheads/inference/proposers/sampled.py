"""Drawn drafts: at temperature > 0 a head draws each draft token from its own distribution.

A head's top-k candidates are point masses to the verifier: the target accepts its best guess
with the target's own probability of that token, which at T = 0.7-1.0 is small even when the
head's distribution is close to the target's. A token DRAWN from the head's distribution q
(processed with the request's temperature/top-k/top-p, like the target's p) is accepted with
probability 1 - TV(p, q) by the verifier's min(1, p/q) rule (`accept.accept_sampling`), and the
output law stays exactly the target's. Drawn drafts form a chain (one draw per depth), which every
head type can draw; a head that drafts autoregressively through a tree (EAGLE's draft layer) also
draws siblings, without replacement (`drawn_trees`).

Each head type keeps its own way of scoring a depth (Medusa's head k, Hydra's head on the path
so far, EAGLE's draft layer on the drawn token, one forward's slot for DFlash and P-EAGLE) and
hands the scores here: `draw` samples a depth for every row, `chain_tree` builds the tree.
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams, sample_rows
from ..tree import Tree, chain_shape


def draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None,
         vocab_ids: torch.Tensor | None = None, vocab_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft per row from ``logits`` [rows, V'] (V' = the draft vocabulary when ``vocab_ids``
    maps it to target ids, of a ``vocab_size``-token target): (target token ids [rows] on the
    logits' device, the laws they were drawn from over the target's vocabulary [rows, vocab_size],
    fp32; the verifier reads q at target ids, tokens outside the draft vocabulary have q = 0).
    `sampling.sample_rows` draws them where the logits are, so drafting reads nothing back from
    the device."""
    laws = params.probs(logits)
    picked = sample_rows(laws, generator)
    if vocab_ids is None:
        return picked, laws
    vocab_ids = vocab_ids.to(logits.device)
    return vocab_ids[picked], laws.new_zeros(laws.shape[0], vocab_size).index_copy_(1, vocab_ids, laws)


def chain_tree(root: int, drafts: torch.Tensor, laws: torch.Tensor) -> Tree:
    """The chain ``root -> drafts[0] -> ...`` with ``laws`` [d, V] (target vocabulary) as the
    draft law of each drafted node; a root alone when nothing was drafted."""
    depth = drafts.shape[0]
    tokens = torch.cat([torch.tensor([root]).to(drafts.device, non_blocking=True), drafts])
    if depth == 0:
        return Tree(chain_shape(0), tokens)
    return Tree(chain_shape(depth), tokens, torch.cat([laws.new_zeros(1, laws.shape[-1]), laws]))


def chains(roots: list[int], drafts: list[torch.Tensor], laws: list[torch.Tensor], depths: list[int]) -> list[Tree]:
    """Per row the chain of its drawn drafts, cut at its depth: ``drafts[k]`` [rows] and ``laws[k]``
    [rows, V] are depth k + 1's draws for every row."""
    if not drafts:
        return [chain_tree(root, torch.zeros(0, dtype=torch.long), torch.zeros(0, 0)) for root in roots]
    tokens, law = torch.stack(drafts, 1), torch.stack(laws, 1)  # [rows, depth], [rows, depth, V]
    return [chain_tree(root, tokens[r, :d], law[r, :d]) for r, (root, d) in enumerate(zip(roots, depths))]


def drawn_blocks(roots: list[int], scores: torch.Tensor, depths: list[int], params: SamplingParams,
                 generator: torch.Generator | None, vocab_ids: torch.Tensor | None, vocab_size: int) -> list[Tree]:
    """A parallel drafter's chains (DFlash, P-EAGLE), one per row: ``scores`` [rows, D, V'] score
    every draft position from ONE forward, so each depth is drawn from its own position's law, none
    conditioned on the draws before it (a valid draft law all the same: the verifier only needs to
    know it). All rows and positions are drawn at once; row r keeps its first ``depths[r]``."""
    rows, positions = scores.shape[:2]
    tokens, laws = draw(scores.reshape(rows * positions, -1), params, generator, vocab_ids, vocab_size)
    tokens, laws = tokens.view(rows, positions), laws.view(rows, positions, -1)
    return [chain_tree(root, tokens[r, :d], laws[r, :d]) for r, (root, d) in enumerate(zip(roots, depths))]
