"""Acceptance arithmetic of static trees, shared by training (its simulated acceptance length)
and calibration (the tree it picks), so both rank heads by the same number.

``acc[k, r]`` is how often head k's rank-r candidate is the token the target produces k+2 ahead.
Assuming independence along a path (as Medusa's tree search does), a path's probability of being
accepted is the product of ``acc`` along it; since at most one child of an accepted node can match
the target, the expected tokens per step of a tree is 1 + the sum of its paths' probabilities.
"""
from __future__ import annotations

import heapq

import torch


def grow_tree(acc: torch.Tensor, max_nodes: int) -> list[tuple[tuple[int, ...], float]]:
    """Best-first growth: (path, path probability) in the order nodes are added (root excluded).

    A node's candidates are its next sibling (same depth, rank+1) and its first child (rank 0,
    one deeper); the frontier always holds the best node not yet in the tree."""
    num_heads, max_rank = acc.shape
    added: list[tuple[tuple[int, ...], float]] = []
    frontier = [(-float(acc[0, 0]), (0,))]
    parent_value = {(): 1.0}
    while frontier and len(added) < max_nodes:
        neg_value, path = heapq.heappop(frontier)
        value = -neg_value
        added.append((path, value))
        parent_value[path] = value
        depth, rank = len(path), path[-1]
        if rank + 1 < max_rank:
            sibling = path[:-1] + (rank + 1,)
            heapq.heappush(frontier, (-parent_value[path[:-1]] * float(acc[depth - 1, rank + 1]), sibling))
        if depth < num_heads:
            heapq.heappush(frontier, (-value * float(acc[depth, 0]), path + (0,)))
    return added


def expected_tokens_per_step(choices: list[list[int]], acc: torch.Tensor) -> float:
    """1 + sum of path probabilities: the simulated acceptance length of a static tree."""
    total = 1.0
    for path in choices:
        p = 1.0
        for depth, rank in enumerate(path):
            p *= float(acc[depth, rank]) if depth < acc.shape[0] and rank < acc.shape[1] else 0.0
        total += p
    return total


# Default static trees per number of heads, small enough to pay off on a CPU, where a verify
# forward's cost grows quickly with the number of tree tokens (benchmarks/demo_target_shapes.py
# measures it). `draftheads calibrate` replaces them with a tree measured on the user's device and heads.
DEFAULT_CHOICES: dict[int, list[list[int]]] = {
    1: [[0], [1], [2]],
    2: [[0], [1], [2], [0, 0], [0, 1], [1, 0]],
    3: [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]],
    4: [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0, 0]],
}


def default_choices(num_heads: int) -> list[list[int]]:
    """The default static tree for ``num_heads`` heads (clipped to 1..4)."""
    return DEFAULT_CHOICES[min(max(num_heads, 1), max(DEFAULT_CHOICES))]
