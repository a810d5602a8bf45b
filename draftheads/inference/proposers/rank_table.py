"""The per-depth, per-rank acceptance table of a drafter that reads every depth off one draft
forward (DFlash, P-EAGLE), measured as decoding drafts: on the target's own greedy continuations,
each root drafted from the committed context before it, "correct" = what greedy verification
accepts. The drafters differ only in how one root's ranked candidates are read (``ranked``)."""
from __future__ import annotations

from typing import Callable

import torch

from ..features import FeatureTap
from ..sampling import SamplingParams


@torch.no_grad()
def rank_hit_table(
    target: torch.nn.Module,
    heads: torch.nn.Module,
    sequences: list[torch.Tensor],
    new_drafter: Callable[[], object],
    ranked: Callable[[object, int, int], torch.Tensor],
    max_rank: int = 10,
    skip_prompt: list[int] | None = None,
    host_tokens: bool = False,
    conditioned: bool = False,
) -> torch.Tensor:
    """acc[d, r] = P(depth d+1's rank-r token == the token d+1 after the root) over the roots of
    ``sequences``, one sequence at a time (a batch of one row). ``ranked(drafter, root_token, max_rank)``
    gives [depths, <= max_rank] candidate token ids; ``host_tokens``: the drafter takes its
    committed tokens on the host. ``conditioned`` (drafters whose depth d depends on the token at
    d-1: `chained.ChainedDrafter`): ``ranked`` also gets the true tokens after the root, and ranks
    depth d given the true token before it, which is the only parent verification ever accepts a
    depth-d node under."""
    depths = heads.config.num_heads
    hits, totals = torch.zeros(depths, max_rank), torch.zeros(depths)
    tap = FeatureTap(target, heads.feature_layers)
    device = target.get_output_embeddings().weight.device
    for i, seq in enumerate(sequences):
        seq = seq.to(device)
        tokens = seq.cpu() if host_tokens else seq
        with tap.capture() as got:
            out = target(seq[None], **tap.forward_kwargs())
        features = tap.features(got, out)[0]
        drafter = new_drafter()
        start = max(1, skip_prompt[i] if skip_prompt else 1)
        drafter.start([tokens[:start]], [features[:start]], SamplingParams(), None)
        for root in range(start, seq.numel() - 1):
            if conditioned:
                ranks = ranked(drafter, int(seq[root]), max_rank, seq[root + 1 : root + 1 + depths])
            else:
                ranks = ranked(drafter, int(seq[root]), max_rank)
            for d in range(min(depths, seq.numel() - 1 - root)):
                totals[d] += 1
                hit = (ranks[d] == seq[root + 1 + d]).nonzero()
                if hit.numel():
                    hits[d, int(hit[0])] += 1
            drafter.accepted([tokens[root : root + 1]], [features[root : root + 1]])
    return hits / totals.clamp(min=1)[:, None]
