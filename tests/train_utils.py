"""Reference implementations the training tests compare the library's optimised losses with."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from draftheads.heads.base import token_context
from draftheads.methods.medusa.loss import IGNORE, medusa_targets


def naive_medusa_loss(
    heads: torch.nn.Module,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    decay: float = 0.8,
) -> torch.Tensor:
    """The Medusa/Hydra loss the plain way: full ``[B, S, K, V]`` logits and one masked mean CE per
    head (what `medusa_loss` computes in chunks without materialising them)."""
    if heads.reads_tokens:
        logits = heads(hidden, token_context(input_ids, heads.config.num_heads)).float()
    else:
        logits = heads(hidden).float()  # [B, S, K, V]
    targets = medusa_targets(input_ids, heads.config.num_heads, loss_mask, attention_mask)
    loss = hidden.new_zeros((), dtype=torch.float32)
    for k in range(heads.config.num_heads):
        if (targets[..., k] != IGNORE).any():
            ce = F.cross_entropy(logits[:, :, k].reshape(-1, logits.shape[-1]), targets[..., k].reshape(-1))
            loss = loss + decay**k * ce
    return loss
