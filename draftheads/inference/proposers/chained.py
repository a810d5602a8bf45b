"""Parallel drafters whose draft position d is scored given the token at position d-1.

DSpark (a Markov bias from the previous token) and DFlash2 (a candidate selector scoring each
candidate against its predecessor) draft a whole block in ONE backbone forward, as DFlash does,
then add a light sequential stage: position d's scores depend on the token drafted at d-1. A
block's tokens therefore depend on each other, and the tree read off that forward must respect
it. A static tree of rank paths (Medusa's format, `parallel.ParallelDrafter`) keeps its shape, but
a node's token is read off its OWN parent's scores: node (depth d, rank r) under parent p takes
the rank-r token of position d's scores given p's token, so two siblings' subtrees hold different
tokens. Ranking is done level by level, every row's parents of one depth in one call.

Drawn drafts (a sampling request) are a chain per row: depth d is drawn from position d's law
given the token drawn at d-1, and that conditional law is what the verifier receives for the node
(``Tree.draft_probs``), so sampling stays exact (an autoregressive draft's law, as a draft model's).

A drafter supplies `ChainedDrafter.scores` (the ONE backbone forward, returning whatever its
sequential stage reads, as a `SlotScores`) and `ChainedDrafter.step_scores` (position d's scores
for some rows given their previous tokens). Everything else is shared.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from ..tree import Tree, TreeShape
from .parallel import Layout, ParallelDrafter
from .sampled import chains, draw


@dataclass
class SlotScores:
    """What one backbone forward gives a chained drafter: tensors indexed [rows, D, ...] (D draft
    positions), named by the drafter (DSpark: the base logits and the slots' states)."""

    tensors: dict[str, torch.Tensor]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def rows(self, index: torch.Tensor) -> "SlotScores":
        """The same scores for the rows ``index`` only."""
        return SlotScores({k: v[index] for k, v in self.tensors.items()})


@dataclass(frozen=True)
class Level:
    """The nodes of one depth of a static tree: their indices, their distinct parents, which of
    those each node hangs under, and each node's rank."""

    nodes: tuple[int, ...]
    parents: tuple[int, ...]
    parent_of: tuple[int, ...]
    ranks: tuple[int, ...]


@lru_cache(maxsize=256)
def levels(shape: TreeShape) -> tuple[Level, ...]:
    """The tree's depths 1..max_depth as `Level`s (host arithmetic, once per shape)."""
    depth = shape.depth.tolist()
    out = []
    for d in range(1, shape.max_depth + 1):
        nodes = tuple(i for i in range(shape.size) if depth[i] == d)
        parents = tuple(sorted({shape.parents[i] for i in nodes}))
        where = {p: j for j, p in enumerate(parents)}
        out.append(Level(nodes, parents, tuple(where[shape.parents[i]] for i in nodes),
                         tuple(shape.ranks[i] for i in nodes)))
    return tuple(out)


class ChainedDrafter(ParallelDrafter):
    """A `ParallelDrafter` whose position d is scored given the token at d-1 (module docstring)."""

    def step_scores(self, slots: SlotScores, rows: torch.Tensor, depth: int, previous: torch.Tensor) -> torch.Tensor:
        """[P, V'] scores of draft position ``depth`` (1-based) for the rows ``rows`` [P] (indices
        into ``slots``) after the tokens ``previous`` [P] (target ids) at position depth-1 (the
        root for depth 1). V' is the draft vocabulary (`vocab_ids` maps it to target ids)."""
        raise NotImplementedError

    def select_rows(self, scores: SlotScores, index: torch.Tensor) -> SlotScores:
        return scores.rows(index)

    def _ranked(self, roots: list[int], scores: SlotScores, layouts: list[Layout]) -> list[Tree]:
        """Each row's static tree, level by level: a node's candidates are its parent's position-d
        scores given the parent's token (one `step_scores` call per depth for every row)."""
        dev = self.device
        tokens = []
        for root, lay in zip(roots, layouts):
            row = torch.empty(lay.shape.size, dtype=torch.long, device=dev)
            row[0] = root
            tokens.append(row)
        row_levels = [levels(lay.shape) for lay in layouts]
        for d in range(1, max(lay.shape.max_depth for lay in layouts) + 1):
            rows, previous, spans, offset, top = [], [], [], 0, 1
            for r, lv in enumerate(row_levels):
                if d > len(lv):
                    continue
                level = lv[d - 1]
                rows += [r] * len(level.parents)
                previous.append(tokens[r][list(level.parents)])
                spans.append((r, level, offset))
                offset += len(level.parents)
                top = max(top, max(level.ranks) + 1)
            step = self.step_scores(scores, torch.tensor(rows).to(dev, non_blocking=True), d, torch.cat(previous))
            candidates = step.topk(top, dim=-1).indices
            if self.vocab_ids is not None:
                candidates = self.vocab_ids[candidates]
            for r, level, off in spans:
                parents = torch.tensor([off + j for j in level.parent_of]).to(dev, non_blocking=True)
                ranks = torch.tensor(level.ranks).to(dev, non_blocking=True)
                tokens[r][list(level.nodes)] = candidates[parents, ranks]
        return [Tree(lay.shape, row) for lay, row in zip(layouts, tokens)]

    def _drawn(self, roots: list[int], scores: SlotScores, layouts: list[Layout]) -> list[Tree]:
        """Each row's drawn chain: depth d drawn from position d's law given the token drawn at d-1
        (all rows at once; a row keeps its first ``depth`` draws)."""
        depths = [lay.shape.max_depth for lay in layouts]
        everyone = torch.arange(len(roots), device=self.device)
        previous = torch.tensor(roots).to(self.device, non_blocking=True)
        drafts, laws = [], []
        for d in range(1, max(depths) + 1):
            token, law = draw(self.step_scores(scores, everyone, d, previous), self._params, self._generator,
                              self.vocab_ids, self.vocab_size)
            drafts.append(token)
            laws.append(law)
            previous = token
        return chains(roots, drafts, laws, depths)


def conditioned_candidates(drafter: ChainedDrafter, root: int, ranks: int, following: torch.Tensor) -> torch.Tensor:
    """[depths, <= ranks] target ids of a batch of one row: depth d's best candidates given the
    TRUE token at d-1 (the root for d = 1, else ``following[d-2]``), from one backbone forward.
    A depth-d node is only ever accepted under the parent holding the true token, so this is what
    the static tree search's acceptance table ranks (`rank_table.rank_hit_table(conditioned=True)`)."""
    depths = drafter.heads.config.num_heads
    with torch.inference_mode():
        slots = drafter.scores([root], [depths])
        previous = torch.cat([torch.tensor([root]), following.cpu()[: depths - 1]]).to(drafter.device)
        row = torch.zeros(1, dtype=torch.long, device=drafter.device)
        out = []
        for d in range(1, previous.numel() + 1):
            step = drafter.step_scores(slots, row, d, previous[d - 1 : d])[0]
            ids = step.topk(min(ranks, step.shape[-1])).indices
            out.append(ids if drafter.vocab_ids is None else drafter.vocab_ids[ids])
        drafter.forwards += 1
    return torch.stack(out)
