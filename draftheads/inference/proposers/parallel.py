"""What the parallel drafters (DFlash, P-EAGLE: every draft position from ONE draft forward)
share: per-row bookkeeping, the batch-wide step, and reading each row's tree off the slot scores.

A drafter supplies one method, `ParallelDrafter.scores`: ONE draft forward over every row of the
batch (each row's newly committed context caught up in the same call), giving per row the scores
of draft positions 1..D. The rest is common:
- a static tree of rank paths (Medusa's format): node (depth d, rank r) takes position d's r-th
  best token, so a row's tree costs that one forward whatever its width; rows near their
  ``max_new_tokens`` cut their own tree shallower and read fewer positions of the same forward;
- drawn drafts (`sampled`) when the request samples: one chain per row, depth d drawn from
  position d's law;
- rows that leave the batch (`keep`): their entries leave the draft cache (`row_cache.RowCache`).

Batch 1 is a batch of one row (what calibration tables and benchmarks drive), so there is one
implementation of each drafter's forward, and the batch differs from one row only by its padding
and masks (tests/test_parallel_rows.py compares them row by row).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tree import Tree, TreeShape
from .feed import FeedRows
from .row_cache import RowCache
from .sampled import drawn_blocks


@dataclass(frozen=True)
class Layout:
    """The static tree cut at a row's depth: each drafted node's position (0-based) and rank, and
    how many ranks it reads (the top-k)."""

    shape: TreeShape
    position: torch.Tensor
    rank: torch.Tensor
    top: int


class ParallelDrafter(FeedRows):
    """The rows' feed (`feed.FeedRows`), the shared draft cache, the step. Subclasses set
    ``shape`` (the static tree), ``feature_layers``, ``vocab_size`` and ``device``, and give
    `scores` and `describe`."""

    shape: TreeShape
    vocab_size: int  # the target's
    #: Slots a step writes past the committed context besides the newly committed positions.
    step_slots: int = 0
    #: Target id of each draft-vocabulary index (None: the target's vocabulary itself).
    vocab_ids: torch.Tensor | None = None

    def __init__(self, cache: RowCache) -> None:
        self.cache = cache  # kept between generations: its buffers are reused when large enough
        self.forwards = 0  # draft forwards so far (one per step that drafts, whatever the rows)
        self._layouts: dict[int, Layout] = {}

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def layout(self, max_depth: int) -> Layout:
        """The tree cut at ``max_depth`` and where its nodes read (cached per depth)."""
        depth = min(max_depth, self.shape.max_depth)
        if depth not in self._layouts:
            shape = self.shape.truncated(depth)
            position = (shape.depth[1:] - 1).to(self.device)
            rank = torch.tensor(shape.ranks[1:], dtype=torch.long, device=self.device)
            self._layouts[depth] = Layout(shape, position, rank, max(shape.ranks[1:], default=0) + 1)
        return self._layouts[depth]

    def start(self, prompts, hidden, params, generator) -> None:
        self.start_feed(prompts, hidden)
        self.cache.start(len(prompts), max(len(ids) for ids in self._ids) + 256 + self.step_slots)
        self.forwards = 0
        self._params, self._generator = params, generator

    def keep(self, rows: list[int]) -> None:
        self.keep_feed(rows)
        self.cache.keep(rows)

    def stats(self) -> dict:
        return self.describe(self.forwards)

    def describe(self, forwards: int) -> dict:
        """The output's stats for a run of ``forwards`` draft forwards."""
        raise NotImplementedError

    # -- one step ---------------------------------------------------------------------------------
    def scores(self, roots: list[int], depths: list[int]) -> torch.Tensor:
        """ONE draft forward for every row: [rows, max(depths), V'] scores of draft positions
        1..D after each row's root (V' = the draft vocabulary, `vocab_ids` maps it). A row with
        depth 0 feeds nothing; its scores are not read."""
        raise NotImplementedError

    @torch.inference_mode()
    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        layouts = [self.layout(d) for d in max_depths]
        drafting = [r for r, lay in enumerate(layouts) if lay.shape.size > 1]
        trees = [None if lay.shape.size > 1 else Tree(lay.shape, torch.tensor([root]))  # plain steps: the root
                 for lay, root in zip(layouts, roots)]
        if not drafting:
            return trees
        depths = [lay.shape.max_depth for lay in layouts]
        scores = self.scores(roots, depths)
        self.forwards += 1
        if len(drafting) < len(roots):
            scores = self.select_rows(scores, torch.tensor(drafting, device=self.device))
        read = self._drawn if self._params.draws_drafts else self._ranked
        for r, tree in zip(drafting, read([roots[r] for r in drafting], scores, [layouts[r] for r in drafting])):
            trees[r] = tree
        return trees

    def select_rows(self, scores: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``scores`` of the rows ``index`` only (the rows that draft this step)."""
        return scores[index]

    def _ranked(self, roots: list[int], scores: torch.Tensor, layouts: list[Layout]) -> list[Tree]:
        """Each row's static tree: node (d, r) = position d's rank-r token, one top-k for all rows."""
        candidates = scores.topk(max(lay.top for lay in layouts), dim=-1).indices  # [rows, D, top]
        if self.vocab_ids is not None:
            candidates = self.vocab_ids[candidates]
        trees = []
        for r, (root, lay) in enumerate(zip(roots, layouts)):
            drafted = candidates[r, lay.position, lay.rank]
            root_t = torch.tensor([root]).to(drafted.device, non_blocking=True)
            trees.append(Tree(lay.shape, torch.cat([root_t, drafted])))
        return trees

    def _drawn(self, roots: list[int], scores: torch.Tensor, layouts: list[Layout]) -> list[Tree]:
        """Each row's drawn chain, as deep as its tree."""
        return drawn_blocks(roots, scores, [lay.shape.max_depth for lay in layouts], self._params, self._generator,
                            self.vocab_ids, self.vocab_size)
