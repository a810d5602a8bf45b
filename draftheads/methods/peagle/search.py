"""What training's tree choice and calibrate measure for P-EAGLE heads, drafted exactly as
decoding drafts them: one forward's cost by depth, and how often each depth's rank-r candidate is
the target's token (`registry.OneForwardSearch`)."""
from __future__ import annotations

import statistics
import time

import torch

from .drafter import PEagleDrafter
from ...inference.proposers.rank_table import rank_hit_table
from ...inference.sampling import SamplingParams


@torch.inference_mode()
def draft_scores(drafter: PEagleDrafter, root: int, depth: int) -> torch.Tensor:
    """Logits [depth, draft vocab] of draft positions 1..depth for one row (the batch of one the
    measurements drive), from the one forward a drafting step runs."""
    return drafter.scores([root], [depth])[0]


def measure_draft_seconds(head: torch.nn.Module, context: int = 64, repeats: int = 10) -> dict[int, float]:
    """Median seconds of one drafting step by depth d (one forward over the newly committed
    position and d - 1 mask slots, then its logits) after ``context`` committed positions. A tree
    of depth d costs this whatever its width: every node comes from the same forward."""
    param = head.fc.weight
    features = torch.randn(context, head.fc.in_features, device=param.device, dtype=param.dtype)
    ids = torch.zeros(context, dtype=torch.long)
    times = {0: 0.0}
    for depth in range(1, head.config.num_heads + 1):
        drafter = PEagleDrafter(head, tree=[[0] * d for d in range(1, depth + 1)])
        drafter.start([ids], [features], SamplingParams(), None)
        draft_scores(drafter, 0, depth)  # feeds the context (later calls feed one position each)
        samples = []
        for _ in range(repeats):
            drafter.accepted([torch.zeros(1, dtype=torch.long)], [features[:1]])
            t0 = time.perf_counter()
            draft_scores(drafter, 0, depth)
            if param.device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        times[depth] = statistics.median(samples)
    return times


def depth_accuracy_table(
    target: torch.nn.Module, head: torch.nn.Module, sequences: list[torch.Tensor], max_rank: int = 10,
    skip_prompt: list[int] | None = None,
) -> torch.Tensor:
    """acc[d, r] = P(depth d+1's rank-r token == the token d+1 after the root) over the roots of
    ``sequences`` (the target's own greedy continuations: "correct" = what verification accepts),
    each step drafted exactly as decoding drafts it (the committed context before the root)."""
    depths = head.config.num_heads

    def ranked(drafter, token: int, ranks: int) -> torch.Tensor:
        scores = draft_scores(drafter, token, depths)
        return drafter.vocab_ids[scores.topk(min(ranks, scores.shape[-1]), dim=-1).indices]

    return rank_hit_table(target, head, sequences, lambda: PEagleDrafter(head), ranked, max_rank, skip_prompt,
                          host_tokens=True)


def draft_seconds(heads: torch.nn.Module, draft_vocab_size: int | None = None) -> dict[int, float]:
    """P-EAGLE ranks its own trained vocabulary: ``draft_vocab_size`` does not apply."""
    return measure_draft_seconds(heads)


def accuracy(target, heads, sequences, max_rank, skip_prompt=None, draft_vocab_size=None) -> torch.Tensor:
    return depth_accuracy_table(target, heads, sequences, max_rank, skip_prompt=skip_prompt)
