"""Drives a drafter over a batch and one drafter of the same settings per row (a batch of one)
through the same steps, for the tests that hold the batch to each row drafted alone (EAGLE,
DFlash, P-EAGLE); `OneRow` gives a drafter's batch-of-one calls one sequence's arguments.

Rows of different prompt lengths (a ragged draft cache from the first step), random accepted
paths (different counts per row), row 2 drafting shallower at step 2 (near its budget) and not at
all at step 4 (its context stays pending), and row 1 leaving the batch after step 3. Features are
random float64, so reduction-order differences stay far from top-k ties.
"""
from __future__ import annotations

from typing import Callable

import torch

from draftheads.inference.sampling import SamplingParams

PROMPT_LENGTHS = (3, 11, 6, 17)
STEPS = 7
LEAVES_AFTER = 3  # row 1 leaves the batch after this step


def accepted_path(tree, gen: torch.Generator) -> torch.Tensor:
    """The path from the root to a random node of ``tree`` (what the verifier may accept)."""
    node = int(torch.randint(tree.shape.size, (1,), generator=gen))
    path = [node]
    while tree.shape.parents[path[-1]] != -1:
        path.append(tree.shape.parents[path[-1]])
    return torch.tensor(path[::-1])


class OneRow:
    """One sequence drafted by ``drafter`` as a batch of one row."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter

    def start(self, ids: torch.Tensor, hidden: torch.Tensor | None, params: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> "OneRow":
        self.drafter.start([ids], [hidden], params, generator)
        return self

    def propose(self, root: int, max_depth: int):
        return self.drafter.propose([root], [max_depth])[0]

    def accepted(self, tokens: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.drafter.accepted([tokens], [hidden])


def drive_alike(batched, make: Callable, feat: int, high: int, check: Callable, started: Callable | None = None) -> None:
    """Step ``batched`` and one ``make()`` drafter per row (alone: a batch of one) alike; after each
    step's trees, ``check(step, row, pos, batched_tree, own_tree)`` for every active row (``row``:
    its original index, ``pos``: its place in the batch now). Token ids are drawn in 3..high-1;
    ``started(alone)`` runs once the per-row drafters have started."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, high, (n,), generator=gen) for n in PROMPT_LENGTHS]
    hidden = [torch.randn(n, feat, generator=gen, dtype=torch.float64) for n in PROMPT_LENGTHS]
    params = SamplingParams()
    batched.start(prompts, hidden, params, None)
    forked = [OneRow(make()).start(ids, h, params) for ids, h in zip(prompts, hidden)]
    if started is not None:
        started([row.drafter for row in forked])
    alive = list(range(len(prompts)))  # original row of each batch position
    roots = [int(t) for t in torch.randint(3, high, (len(prompts),), generator=gen)]
    for step in range(STEPS):
        max_depths = [{(2, 2): 2, (4, 2): 0}.get((step, r), 64) for r in alive]
        trees = batched.propose(roots, max_depths)
        for pos, r in enumerate(alive):
            check(step, r, pos, trees[pos], forked[r].propose(roots[pos], max_depths[pos]))
        paths = [accepted_path(t, gen) for t in trees]
        toks = [t.tokens[p] for t, p in zip(trees, paths)]
        feats = [torch.randn(p.numel(), feat, generator=gen, dtype=torch.float64) for p in paths]
        batched.accepted(toks, feats)
        for r, t, f in zip(alive, toks, feats):
            forked[r].accepted(t, f)
        roots = [int(t) for t in torch.randint(3, high, (len(alive),), generator=gen)]
        if step == LEAVES_AFTER:
            keep = [pos for pos, r in enumerate(alive) if r != 1]
            batched.keep(keep)
            alive = [alive[pos] for pos in keep]
            roots = [roots[pos] for pos in keep]
