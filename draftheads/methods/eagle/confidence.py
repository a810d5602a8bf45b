"""Measuring an EAGLE heads' confidence table (`heads.confidence`): how often the target accepts a
candidate of each rank and draft probability, on the target's own greedy continuations.

Each position of a continuation is a root, drafted from the committed text before it as decoding
drafts it (the same draft cache, fed the target's real features). Greedy verification accepts a
node exactly when its parent was accepted and its token is the target's next token, so only the
children of nodes on the true path are counted: each with its rank among its siblings, its
conditional draft probability (its joint one over its parent's) and whether it is the true token.
A true node the search did not expand ends that root's walk, as it would end verification.
"""
from __future__ import annotations

import torch

from ...heads.confidence import ConfidenceCalibration
from ...inference.features import FeatureTap
from ...inference.sampling import SamplingParams
from .drafter import EagleDrafter

#: Measured with this many children per node, four levels deep: the ranks and depths the CPU and
#: GPU grids draft.
MEASURE_TOP_K = 4
MEASURE_DEPTH = 4


@torch.no_grad()
def measure_confidence(target: torch.nn.Module, heads: torch.nn.Module, sequences: list[torch.Tensor],
                       skip_prompt: list[int], top_k: int = MEASURE_TOP_K, depth: int = MEASURE_DEPTH,
                       draft_vocab_size: int | None = None) -> ConfidenceCalibration:
    """The table over every root after each sequence's first ``skip_prompt[i]`` tokens (its
    prompt): ``sequences`` are the target's greedy continuations, one row each."""
    drafter = EagleDrafter(heads, total_tokens=2, depth=depth, top_k=top_k, draft_vocab_size=draft_vocab_size)
    tap = FeatureTap(target, drafter.feature_layers)
    device = target.get_output_embeddings().weight.device
    records: list[tuple[int, float, bool]] = []
    roots = 0
    for seq, start in zip(sequences, skip_prompt):
        seq = seq.to(device)
        with tap.capture() as got:
            out = target(seq[None], **tap.forward_kwargs())
        features = tap.features(got, out)[0]
        start = max(1, start)
        drafter.start([seq[:start]], [features[:start]], SamplingParams(), None)
        for root in range(start, seq.numel() - 1):
            tokens, parents, scores = drafter.scored_nodes(int(seq[root]))
            records += _walk(tokens, parents, scores, seq[root + 1 : root + 1 + depth].cpu())
            roots += 1
            drafter.accepted([seq[root : root + 1]], [features[root : root + 1]])
    return ConfidenceCalibration.fit(records, top_k, measured_on={
        "sequences": len(sequences), "roots": roots, "candidates": len(records), "top_k": top_k, "depth": depth})


def _walk(tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor,
          truth: torch.Tensor) -> list[tuple[int, float, bool]]:
    """(rank, conditional draft probability, accepted) of every child of a node on the true path."""
    joint = torch.cat([torch.zeros(1), scores])  # node 0: the root
    node, out = 0, []
    for want in truth.tolist():
        children = (parents == node).nonzero().squeeze(-1).tolist()  # created in rank order
        following = None
        for rank, i in enumerate(children):
            hit = int(tokens[i]) == want
            out.append((rank, float((joint[i + 1] - joint[node]).exp()), hit))
            if hit:
                following = i + 1
        if following is None:
            break
        node = following
    return out
