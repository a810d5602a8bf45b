"""Candidate trees: topology (parents) built once per shape, tokens filled in each step.

A tree's node 0 is the root: the next token, already decided by the target, not yet in its
cache. Every other node is a drafted continuation of its parent. A chain is a tree with one
branch. Static Medusa-style trees are written as "choices": each path is a list of per-head
ranks, e.g. ``[0, 1]`` = head 0's best token followed by head 1's second-best.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import torch

from ..heads.acceptance import DEFAULT_CHOICES, default_choices  # noqa: F401 (re-exported)
from ..plans import StaticTree


@dataclass(frozen=True, eq=False)
class TreeShape:
    """Topology of a candidate tree. ``parents[0] == -1``; ``parents[i] < i`` for every other node."""

    parents: tuple[int, ...]
    # For static trees: the head rank each node takes (root: -1). Dynamic trees leave it empty.
    ranks: tuple[int, ...] = ()
    choices: tuple[tuple[int, ...], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        if not self.parents or self.parents[0] != -1:
            raise ValueError("a tree needs a root (node 0, parent -1)")
        for i, p in enumerate(self.parents[1:], start=1):
            if not 0 <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must come before their children")

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_choices(cls, choices: list[list[int]] | list[tuple[int, ...]]) -> "TreeShape":
        """Static tree from rank paths. Every prefix of a path must be a path too (connected)."""
        paths = sorted({tuple(int(r) for r in c) for c in choices if len(c) > 0}, key=lambda c: (len(c), c))
        index = {(): 0}
        parents, ranks = [-1], [-1]
        for path in paths:
            if any(r < 0 for r in path):
                raise ValueError(f"tree path {list(path)} has a negative rank")
            if path[:-1] not in index:
                raise ValueError(f"tree path {list(path)} has no parent path {list(path[:-1])} in the tree")
            index[path] = len(parents)
            parents.append(index[path[:-1]])
            ranks.append(path[-1])
        return cls(tuple(parents), tuple(ranks), tuple(paths))

    @classmethod
    def chain(cls, length: int) -> "TreeShape":
        """Root plus ``length`` drafted tokens in a line (classic speculative decoding)."""
        return cls.from_choices([[0] * d for d in range(1, length + 1)])

    # -- derived topology (computed once, reused every step) ------------------------------------
    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depth(self) -> torch.Tensor:
        depth = [0] * self.size
        for i, p in enumerate(self.parents[1:], start=1):
            depth[i] = depth[p] + 1
        return torch.tensor(depth, dtype=torch.long)

    @cached_property
    def parents_tensor(self) -> torch.Tensor:
        """[n] long: each node's parent (root: -1), what a hybrid target's state layers scan by."""
        return torch.tensor(self.parents, dtype=torch.long)

    @cached_property
    def max_depth(self) -> int:
        """Host arithmetic (asked several times a step: no tensor ops)."""
        depth = [0] * self.size
        for i, p in enumerate(self.parents[1:], start=1):
            depth[i] = depth[p] + 1
        return max(depth)

    @cached_property
    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool: node i may attend to node j (j is i or an ancestor of i)."""
        # Built as Python lists, then ONE tensor: dynamic (EAGLE) trees build a new shape every step,
        # and row-by-row tensor writes cost ~100 small ops per step there.
        n = self.size
        rows: list[list[bool]] = []
        for i in range(n):
            row = list(rows[self.parents[i]]) if i else [False] * n
            row[i] = True
            rows.append(row)
        return torch.tensor(rows, dtype=torch.bool)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in range(self.size)]
        for i, p in enumerate(self.parents[1:], start=1):
            kids[p].append(i)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def leaf_paths(self) -> tuple[tuple[int, ...], ...]:
        """Node indices of every root-to-leaf path, root first, leaves in node order."""
        rows = []
        for leaf in (i for i in range(self.size) if not self.children[i]):
            path, j = [], leaf
            while j >= 0:
                path.append(j)
                j = self.parents[j]
            rows.append(tuple(path[::-1]))
        return tuple(rows)

    @cached_property
    def paths(self) -> torch.Tensor:
        """[num_leaves, max_depth + 1] node indices of every root-to-leaf path, padded with -1."""
        width = self.max_depth + 1
        return torch.tensor([list(p) + [-1] * (width - len(p)) for p in self.leaf_paths], dtype=torch.long)

    @cached_property
    def _truncations(self) -> dict[int, "TreeShape"]:
        """max_depth -> truncated shape, filled by truncated() (the shape is frozen, so its
        derived values are cached_property like the ones above)."""
        return {}

    @cached_property
    def on_device(self) -> dict:
        """(device, dtype) -> the shape's topology built there, filled by verify.shape_on_device
        (built once per shape, not once per step)."""
        return {}

    def truncated(self, max_depth: int) -> "TreeShape":
        """The same tree without nodes deeper than ``max_depth`` (used near max_new_tokens)."""
        if max_depth >= self.max_depth:
            return self
        cache = self._truncations
        if max_depth not in cache:
            keep = [i for i in range(self.size) if int(self.depth[i]) <= max_depth]
            new_index = {old: new for new, old in enumerate(keep)}
            parents = tuple(-1 if i == 0 else new_index[self.parents[i]] for i in keep)
            ranks = tuple(self.ranks[i] for i in keep) if self.ranks else ()
            choices = tuple(c for c in self.choices if len(c) <= max_depth)
            cache[max_depth] = TreeShape(parents, ranks, choices)
        return cache[max_depth]


@lru_cache(maxsize=None)
def chain_shape(length: int) -> TreeShape:
    """THE chain of ``length`` drafts (0: the root alone, a plain step), one shape object per
    length for every proposer that drafts chains: the topology it derives (masks, paths, its
    device copies) is built once, not every step."""
    return TreeShape.chain(length)


def static_shape(tree: "TreeShape | StaticTree | list", who: str) -> TreeShape:
    """The topology of a static tree given as a shape, a `plans.StaticTree` or rank paths;
    a ValueError naming ``who`` (the heads) for dynamic-tree settings."""
    if isinstance(tree, TreeShape):
        return tree
    return TreeShape.from_choices(StaticTree.parse(tree, who).paths)


@dataclass
class Tree:
    """One step's candidates: a shape and its tokens (``tokens[0]`` is the root).

    ``draft_probs`` is set by proposers that SAMPLE their drafts (a draft LM): row i is the
    distribution q that node i's token was drawn from, and the verifier then uses the
    min(1, p/q) rule. Without it, drafts are deterministic (top-k) and are point masses.
    """

    shape: TreeShape
    tokens: torch.Tensor  # [n] long
    draft_probs: torch.Tensor | None = None  # [n, vocab], row 0 unused

    def __post_init__(self) -> None:
        if self.tokens.shape != (self.shape.size,):
            raise ValueError(f"tree has {self.shape.size} nodes but {tuple(self.tokens.shape)} tokens")

    def truncated(self, max_depth: int) -> "Tree":
        """The same candidates without the nodes deeper than ``max_depth`` (their draft laws too)."""
        shape = self.shape.truncated(max_depth)
        if shape is self.shape:
            return self
        keep = (self.shape.depth <= max_depth).nonzero().squeeze(-1)
        tokens = self.tokens[keep.to(self.tokens.device)]
        probs = None if self.draft_probs is None else self.draft_probs[keep.to(self.draft_probs.device)]
        return Tree(shape, tokens, probs)
