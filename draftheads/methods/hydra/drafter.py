"""Hydra drafting: the static tree filled depth by depth, each head told its path's tokens.

Depth d's candidates come from head d-1 run on the target's hidden state and the tokens on the
path to their parent (root first). All parents at one depth go through the head together, so
drafting costs one small MLP batch per depth, then the same restricted-vocabulary projection as
Medusa. Which nodes, parents and ranks each depth fills is the tree's topology: worked out once
per shape (`_levels`), so a step runs only the heads and a few gathers, and the drafted tokens
stay on the heads' device (no host read while drafting).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...inference.sampling import SamplingParams
from ...inference.tree import Tree, TreeShape
from ..medusa.drafter import MedusaDrafter
from ...inference.proposers.sampled import chains, draw


@dataclass(frozen=True)
class Level:
    """What one depth of a tree shape fills, as index tensors on the heads' device."""

    head: int  # the head that drafts this depth (depth - 1)
    nodes: torch.Tensor  # [m] the depth's node ids
    paths: torch.Tensor  # [P, depth] root-first node ids of the path to each distinct parent
    parent_row: torch.Tensor  # [m] which of the P parents each node hangs from
    ranks: torch.Tensor  # [m] each node's rank among its parent's candidates
    top: int  # candidates needed per parent (the largest rank + 1)


def path_nodes(shape: TreeShape, node: int) -> list[int]:
    """Node ids from the root down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = shape.parents[node]
    return path[::-1]


def levels(shape: TreeShape, device: torch.device) -> list[Level]:
    """Per depth 1..max_depth of ``shape``, what `HydraDrafter.draft_rows` fills there."""
    out = []
    depth = shape.depth.tolist()
    for d in range(1, shape.max_depth + 1):
        nodes = [i for i, di in enumerate(depth) if di == d]
        parents = sorted({shape.parents[i] for i in nodes})
        row_of = {p: j for j, p in enumerate(parents)}
        ranks = [shape.ranks[i] for i in nodes]
        as_index = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
        out.append(Level(
            head=d - 1, nodes=as_index(nodes), paths=as_index([path_nodes(shape, p) for p in parents]),
            parent_row=as_index([row_of[shape.parents[i]] for i in nodes]), ranks=as_index(ranks), top=max(ranks) + 1,
        ))
    return out


class HydraDrafter(MedusaDrafter):
    """Hydra heads drafting all rows at once: each depth runs every row's parents through its head."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._level_cache: dict[int, list[Level]] = {}

    def _levels(self, max_depth: int) -> tuple[TreeShape, list[Level]]:
        shape = self._layout(max_depth)[0]
        if max_depth not in self._level_cache:
            self._level_cache[max_depth] = levels(shape, self.heads_device)
        return shape, self._level_cache[max_depth]

    @torch.no_grad()
    def draft_rows(self, roots: torch.Tensor, hidden: torch.Tensor, max_depth: int) -> tuple[TreeShape, torch.Tensor]:
        """`MedusaDrafter.draft_rows` for Hydra: ``roots`` [B], ``hidden`` [B, H] -> the shape and tokens [B, n] (on the
        heads' device); every depth runs all rows' parents through its head at once."""
        shape, per_depth = self._levels(max_depth)
        device = self.heads_device
        roots = roots.reshape(-1, 1)
        if shape.size == 1:
            return shape, roots.cpu()
        tokens = torch.zeros(roots.shape[0], shape.size, dtype=torch.long, device=device)
        tokens[:, :1] = roots.to(device, non_blocking=True)
        hidden = hidden.to(device)
        for level in per_depth:
            context = tokens[:, level.paths]  # [B, P, depth]
            state = self.heads.head_state(hidden[:, None, :].expand(-1, level.paths.shape[0], -1), context, level.head)
            weight, bias = self._projections[level.head]
            logits = torch.nn.functional.linear(state.to(weight.dtype), weight, bias)  # [B, P, V]
            best = logits.topk(level.top, dim=-1).indices
            if self.vocab_ids is not None:
                best = self.vocab_ids[best]
            tokens[:, level.nodes] = best[:, level.parent_row, level.ranks]
        return shape, tokens

    @torch.no_grad()
    def draw_chains(self, roots: list[int], hidden: torch.Tensor, max_depths: list[int], params: SamplingParams,
                    generator: torch.Generator | None) -> list[Tree]:
        """`MedusaDrafter.draw_chains` for Hydra: head k reads the root and the k drafts drawn
        before it, so the depths are drawn one after another."""
        depths = [min(d, self.shape.max_depth) for d in max_depths]
        device = self.heads_device
        path = torch.tensor(roots, dtype=torch.long, device=device)[:, None, None]  # [B, 1, tokens so far]
        hidden = hidden.to(device)[:, None, :]
        drafts, laws = [], []
        for k in range(max(depths)):
            state = self.heads.head_state(hidden, path, k)
            weight, bias = self._projections[k]
            tokens, law = draw(torch.nn.functional.linear(state[:, 0].to(weight.dtype), weight, bias), params,
                               generator, self.vocab_ids, self.heads.config.vocab_size)
            path = torch.cat([path, tokens[:, None, None]], dim=2)
            drafts.append(tokens)
            laws.append(law)
        return chains(roots, drafts, laws, depths)
