"""What training's tree choice and calibrate measure for DSpark heads, drafted as decoding drafts
them: one block forward's cost (every tree costs it: the Markov stage is a few small matmuls per
depth, timed with it) and how often depth d's rank-r candidate, GIVEN the true token at d-1, is the
target's token (`registry.OneForwardSearch`). A node at depth d is only ever accepted under the
parent holding the true token, so the table conditioned on it is the one the static tree search
needs (`inference/proposers/chained.py`)."""
from __future__ import annotations

import statistics
import time

import torch

from .drafter import DSparkDrafter
from ..dflash.search import whole_or
from ...inference.proposers.chained import conditioned_candidates
from ...inference.proposers.rank_table import rank_hit_table
from ...inference.sampling import SamplingParams


def markov_accuracy_table(target, heads, sequences, max_rank: int = 10, skip_prompt=None, draft_vocab_size=None):
    """acc[d, r] = P(depth d+1's rank-r candidate given the true token at depth d == the target's
    token) over the roots of ``sequences`` (the target's greedy continuations)."""
    size = whole_or(heads, draft_vocab_size)
    return rank_hit_table(target, heads, sequences, lambda: DSparkDrafter(heads, draft_vocab_size=size),
                          conditioned_candidates, max_rank, skip_prompt, conditioned=True)


def measure_step_seconds(heads, context: int = 64, repeats: int = 10, draft_vocab_size=None) -> float:
    """Median seconds of one drafting step of the whole chain (the block forward and the Markov
    stage of every depth) after ``context`` committed positions."""
    drafter = DSparkDrafter(heads, draft_vocab_size=whole_or(heads, draft_vocab_size))
    param = heads.fc.weight
    features = torch.randn(context, heads.fc.in_features, device=param.device, dtype=param.dtype)
    drafter.start([torch.zeros(context, dtype=torch.long)], [features], SamplingParams(), None)
    samples = []
    for rep in range(repeats + 1):
        t0 = time.perf_counter()
        drafter.propose([0], [heads.config.num_heads])
        if param.device.type == "cuda":
            torch.cuda.synchronize()
        if rep:  # the first call also fills the context cache
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def draft_seconds(heads, draft_vocab_size=None) -> dict[int, float]:
    """One block forward whatever the tree (0: plain); the Markov stage is timed with it."""
    step = measure_step_seconds(heads, draft_vocab_size=draft_vocab_size)
    return {0: 0.0, **{d: step for d in range(1, heads.config.num_heads + 1)}}
