"""Hydra proposer: the static tree filled depth by depth, each head told its path's tokens.

Depth d's candidates come from head d-1 run on the target's hidden state and the tokens on the
path to their parent (root first). All parents at one depth go through the head together, so
drafting costs one small MLP batch per depth, then the same restricted-vocabulary projection as
Medusa.
"""
from __future__ import annotations

import torch

from ..tree import Tree, TreeShape
from .medusa import MedusaProposer


class HydraProposer(MedusaProposer):
    def propose(self, root: int, max_depth: int) -> Tree:
        shape, head_of, rank, top, _ = self._layout(max_depth)
        if shape.size == 1:
            return Tree(shape, torch.tensor([root]))
        tokens = torch.zeros(shape.size, dtype=torch.long)
        tokens[0] = root
        hidden = self._last_hidden.to(self.heads_device)
        depth = shape.depth
        for d in range(1, shape.max_depth + 1):
            nodes = (depth == d).nonzero().squeeze(-1)
            parents = torch.tensor([shape.parents[i] for i in nodes.tolist()])
            unique_parents = parents.unique()
            # Path tokens root..parent for every parent at depth d-1: [p, d]
            context = torch.stack([self._path_tokens(shape, int(p), tokens) for p in unique_parents])
            context = context.to(self.heads_device)
            state = self.heads.head_state(hidden.expand(context.shape[0], -1), context, d - 1)
            weight, bias = self._projections[d - 1]
            logits = torch.nn.functional.linear(state.to(weight.dtype), weight, bias)
            node_ranks = torch.tensor([shape.ranks[i] for i in nodes.tolist()])
            best = logits.topk(int(node_ranks.max()) + 1, dim=-1).indices
            if self.vocab_ids is not None:
                best = self.vocab_ids[best]
            row = torch.searchsorted(unique_parents, parents)
            tokens[nodes] = best.cpu()[row, node_ranks]
        return Tree(shape, tokens)

    @staticmethod
    def _path_tokens(shape, node: int, tokens: torch.Tensor) -> torch.Tensor:
        path = []
        while node >= 0:
            path.append(int(tokens[node]))
            node = shape.parents[node]
        return torch.tensor(path[::-1])

    @torch.no_grad()
    def draft_rows(self, roots: torch.Tensor, hidden: torch.Tensor, max_depth: int) -> tuple[TreeShape, torch.Tensor]:
        """Batched `propose`: ``roots`` [B], ``hidden`` [B, H] -> the shape and tokens [B, n]; every
        depth runs all rows' parents through its head at once."""
        shape, _, _, _, _ = self._layout(max_depth)
        rows = roots.numel()
        tokens = torch.zeros(rows, shape.size, dtype=torch.long)
        tokens[:, 0] = roots.reshape(-1).cpu()
        if shape.size == 1:
            return shape, tokens
        hidden = hidden.to(self.heads_device)
        depth = shape.depth
        for d in range(1, shape.max_depth + 1):
            nodes = (depth == d).nonzero().squeeze(-1)
            parents = torch.tensor([shape.parents[i] for i in nodes.tolist()])
            unique_parents = parents.unique()
            paths = torch.stack([self._path_nodes(shape, int(p)) for p in unique_parents])  # [P, d]
            context = tokens[:, paths].to(self.heads_device)  # [B, P, d]
            state = self.heads.head_state(hidden[:, None, :].expand(-1, paths.shape[0], -1), context, d - 1)
            weight, bias = self._projections[d - 1]
            logits = torch.nn.functional.linear(state.to(weight.dtype), weight, bias)  # [B, P, V]
            node_ranks = torch.tensor([shape.ranks[i] for i in nodes.tolist()])
            best = logits.topk(int(node_ranks.max()) + 1, dim=-1).indices
            if self.vocab_ids is not None:
                best = self.vocab_ids[best]
            row = torch.searchsorted(unique_parents, parents)
            tokens[:, nodes] = best.cpu()[:, row, node_ranks]
        return shape, tokens

    @staticmethod
    def _path_nodes(shape, node: int) -> torch.Tensor:
        path = []
        while node >= 0:
            path.append(node)
            node = shape.parents[node]
        return torch.tensor(path[::-1])
