"""Medusa's typical acceptance: LOSSY, opt-in (``acceptance="typical"``), kept out of the lossless
rules of `accept` so that nothing exact depends on it.

More drafts are accepted than by rejection sampling, but the output no longer follows the
target's distribution: a draft is kept whenever the target finds it plausible enough.
"""
from __future__ import annotations

import torch

from .accepted import Acceptance
from .masks import shape_on_device
from .sampling import SamplingParams, sample
from .tree import Tree


def accept_typical(
    tree: Tree,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    epsilon: float = 0.09,
    delta: float = 0.3,
) -> Acceptance:
    """Medusa's "typical acceptance". LOSSY: the output no longer follows the target's
    distribution. A draft x is accepted when p(x) > min(epsilon, delta * exp(-H(p))) under
    the target's processed distribution p at its parent; the longest such path wins and the
    next token is sampled from p at its end. Opt-in only (`acceptance="typical"`)."""
    probs = params.probs(logits)  # stays on the device; only the path comes to the host
    entropy = -(probs * probs.clamp(min=1e-30).log()).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, epsilon), delta * torch.exp(-entropy))
    tokens = tree.tokens.to(probs.device, non_blocking=True)
    paths = shape_on_device(tree.shape, probs.device, logits.dtype).paths
    if paths.shape[1] == 1:
        return Acceptance(torch.zeros(1, dtype=torch.long), sample(probs[0], generator))
    child, parent = paths[:, 1:].clamp(min=0), paths[:, :-1].clamp(min=0)
    p_child = probs[parent, tokens[child]]
    ok = (paths[:, 1:] >= 0) & (p_child > threshold[parent])
    lengths = ok.long().cumprod(dim=1).sum(dim=1)
    best = int(lengths.argmax())
    path = paths[best, : int(lengths[best]) + 1]
    return Acceptance(path.cpu(), sample(probs[path[-1]], generator))
