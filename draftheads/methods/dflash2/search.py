"""What training's tree choice and calibrate measure for DFlash2 heads, drafted as decoding drafts
them: one drafting step's cost (the block forward and the selector's walk; every tree costs about
that) and how often depth d's rank-r candidate, GIVEN the true token at d-1, is the target's
token (`registry.OneForwardSearch`; `proposers.chained.conditioned_candidates`)."""
from __future__ import annotations

import statistics
import time

import torch

from .drafter import DFlash2Drafter
from ...inference.proposers.chained import conditioned_candidates
from ...inference.proposers.rank_table import rank_hit_table
from ...inference.sampling import SamplingParams


def selector_accuracy_table(target, heads, sequences, max_rank: int = 10, skip_prompt=None, draft_vocab_size=None):
    """acc[d, r] = P(depth d+1's rank-r selector candidate given the true token at depth d == the
    target's token) over the roots of ``sequences``; ranks past ``selector_top_k`` never hit."""
    return rank_hit_table(target, heads, sequences, lambda: DFlash2Drafter(heads), conditioned_candidates, max_rank,
                          skip_prompt, conditioned=True)


def measure_step_seconds(heads, context: int = 64, repeats: int = 10) -> float:
    """Median seconds of one drafting step of the whole chain after ``context`` committed positions."""
    drafter = DFlash2Drafter(heads)
    param = heads.fc.weight
    features = torch.randn(context, heads.fc.in_features, device=param.device, dtype=param.dtype)
    drafter.start([torch.zeros(context, dtype=torch.long)], [features], SamplingParams(), None)
    samples = []
    for rep in range(repeats + 1):
        t0 = time.perf_counter()
        drafter.propose([0], [heads.config.num_heads])
        if param.device.type == "cuda":
            torch.cuda.synchronize()
        if rep:
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def draft_seconds(heads, draft_vocab_size=None) -> dict[int, float]:
    step = measure_step_seconds(heads)
    return {0: 0.0, **{d: step for d in range(1, heads.config.num_heads + 1)}}
