"""What training's tree choice and calibrate measure for DFlash heads, drafted exactly as decoding
drafts them: the cost of one block forward (every tree costs it, whatever its shape) and how often
each slot's rank-r candidate is the target's token (`registry.OneForwardSearch`)."""
from __future__ import annotations

import statistics
import time

import torch

from .drafter import DFlashDrafter
from ...inference.proposers.rank_table import rank_hit_table
from ...inference.sampling import SamplingParams


def whole_or(heads: torch.nn.Module, draft_vocab_size: int | None) -> int:
    """``draft_vocab_size`` as the drafter takes it where None must mean the WHOLE vocabulary
    (measurements of a given size), not the heads' calibrated default."""
    return int(heads.config.vocab_size) if draft_vocab_size is None else int(draft_vocab_size)


def measure_block_seconds(heads: torch.nn.Module, context: int = 64, repeats: int = 10,
                          draft_vocab_size: int | None = None) -> float:
    """Median seconds of one drafting step (the block forward and its drafted slots' logits over
    the draft vocabulary, None: the whole one) after ``context`` committed positions: the cost of
    every tree these heads draft, whatever its shape."""
    drafter = DFlashDrafter(heads, draft_vocab_size=whole_or(heads, draft_vocab_size))
    param = heads.fc.weight
    features = torch.randn(context, heads.fc.in_features, device=param.device, dtype=param.dtype)
    drafter.start([torch.zeros(context, dtype=torch.long)], [features], SamplingParams(), None)
    samples = []
    for rep in range(repeats + 1):
        t0 = time.perf_counter()
        with torch.inference_mode():
            drafter.scores([0], [heads.config.num_heads])  # the forward every tree drafts from
        if param.device.type == "cuda":
            torch.cuda.synchronize()
        if rep:  # the first call also fills the context cache
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def block_accuracy_table(
    target: torch.nn.Module, heads: torch.nn.Module, sequences: list[torch.Tensor], max_rank: int = 10,
    skip_prompt: list[int] | None = None, draft_vocab_size: int | None = None,
) -> torch.Tensor:
    """acc[k, r] = P(slot k+1's rank-r token == the token k+1 after the root) over the roots of
    ``sequences`` (the target's own greedy continuations: "correct" = what verification accepts),
    each block drafted exactly as decoding drafts it (the committed context before the root),
    ranking the draft vocabulary of ``draft_vocab_size`` tokens (None: the whole vocabulary)."""
    def ranked(drafter, token: int, ranks: int) -> torch.Tensor:
        logits = drafter.draft_logits([token])[0]
        return drafter.target_ids(logits.topk(min(ranks, logits.shape[-1]), dim=-1).indices)

    size = whole_or(heads, draft_vocab_size)
    return rank_hit_table(target, heads, sequences, lambda: DFlashDrafter(heads, draft_vocab_size=size), ranked,
                          max_rank, skip_prompt)


def draft_seconds(heads: torch.nn.Module, draft_vocab_size: int | None = None) -> dict[int, float]:
    """DFlash runs its whole block whatever the tree: one cost for every depth (0: plain)."""
    block = measure_block_seconds(heads, draft_vocab_size=draft_vocab_size)
    return {0: 0.0, **{d: block for d in range(1, heads.config.num_heads + 1)}}
