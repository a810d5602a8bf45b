"""The Medusa training loss, computed in chunks so vocab-sized fp32 logits stay small.

``loss = sum_k decay**k * CE_k`` where ``CE_k`` is head k's mean cross-entropy over the positions
whose target token (t + 2 + k) is a training token. A naive implementation builds logits of shape
``[batch, seq, heads, vocab]`` (batch 8 x 2048 tokens x 4 heads x 128k vocab in fp32 is 32 GB),
and autograd keeps them for the backward pass. Here positions are flattened, only positions with
at least one valid target are kept, and each (chunk, head) projection + cross-entropy runs under
``torch.utils.checkpoint``: autograd stores only the head's hidden state for the chunk and
recomputes the logits during backward, one chunk at a time. Accuracy counts come from the same
logits, for free; evaluation also asks for per-rank hit counts (``ranks``), which the simulated
acceptance of a tree needs, while training steps skip that top-R sort.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ...heads.base import token_context  # noqa: F401 (re-exported: the tokens Hydra heads read)
from ...train.head_loss import HeadLoss, HeadLossOutput, LossBatch
from ...train.packing import within_document

IGNORE = -100


def medusa_targets(
    input_ids: torch.Tensor,
    num_heads: int,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, S, K]`` target ids: ``targets[b, t, k] = input_ids[b, t+2+k]`` where that token is a
    training token (loss_mask 1) inside the attention mask, with position t attended too and (a
    packed window's ``position_ids``) in the same document; else IGNORE."""
    bsz, seq = input_ids.shape
    lm = torch.ones_like(input_ids, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
    am = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    targets = torch.full((bsz, seq, num_heads), IGNORE, dtype=torch.long, device=input_ids.device)
    for k in range(num_heads):
        shift = 2 + k
        if shift >= seq:
            break
        valid = within_document(lm[:, shift:] & am[:, shift:] & am[:, :-shift], position_ids, shift)
        targets[:, :-shift, k] = torch.where(valid, input_ids[:, shift:], IGNORE)
    return targets


def _head_states(heads: torch.nn.Module, hidden: torch.Tensor, context: torch.Tensor | None) -> list[torch.Tensor]:
    return heads.head_states(hidden) if context is None else heads.head_states(hidden, context)


def _project_ce(heads: torch.nn.Module, k: int, topk: int, ranks: int, state: torch.Tensor, target: torch.Tensor):
    """Head k's summed CE over ``state`` rows, plus top-1/top-k hit counts and, if ``ranks``,
    ``[ranks]`` per-rank hit counts (no grad)."""
    logits = heads.project(state, k).float()
    ce = F.cross_entropy(logits, target, reduction="sum")
    with torch.no_grad():
        top1 = (logits.argmax(-1) == target).sum()
        top = logits.topk(min(max(topk, ranks), logits.shape[-1]), dim=-1).indices == target[:, None]
        hits = top[:, :topk].any(-1).sum()
        by_rank = F.pad(top[:, :ranks].sum(0), (0, max(0, ranks - top.shape[1]))) if ranks else None
    return ce, top1, hits, by_rank


class MedusaLoss(HeadLoss):
    """Chunked Medusa loss (Medusa and Hydra heads) on the target's last hidden state
    ``batch.hidden`` [B, S, H]: head k predicts token t+2+k of the labels (``settings.labels``:
    the data's tokens, or the target's greedy ones). ``batch.ranks`` > 0 also counts, per head,
    hits of each rank r < ranks (``rank_hits``). ``batch.denominators`` [K]: divide head k's
    summed CE by this instead of this batch's own count (the training loop passes the count over
    every micro-batch and process of the step, so the gradient does not depend on how tokens fall
    across them). ``batch.position_ids``: a packed window's per-document positions (no head pairs
    tokens of two documents)."""

    def __call__(self, heads: torch.nn.Module, batch: LossBatch) -> HeadLossOutput:
        settings, ranks = self.settings, batch.ranks
        hidden, loss_mask, attention_mask = batch.hidden, batch.loss_mask, batch.attention_mask
        input_ids = batch.target_labels() if settings.labels == "target" else batch.input_ids
        num_heads = heads.config.num_heads
        device = hidden.device
        targets = medusa_targets(input_ids, num_heads, loss_mask, attention_mask, batch.position_ids).reshape(-1, num_heads)
        flat = hidden.reshape(-1, hidden.shape[-1])
        rows = (targets != IGNORE).any(-1).nonzero().squeeze(-1)
        flat, targets = flat[rows], targets[rows]
        # Hydra heads also read the tokens before the one they predict.
        context = token_context(input_ids, num_heads).reshape(-1, num_heads)[rows] if heads.reads_tokens else None
        count = (targets != IGNORE).sum(0)
        weights = _weights(settings.decay, count, batch.denominators)

        ce_sum = torch.zeros(num_heads, device=device, dtype=torch.float32)
        top1 = torch.zeros(num_heads, device=device, dtype=torch.long)
        hits = torch.zeros(num_heads, device=device, dtype=torch.long)
        rank_hits = torch.zeros(num_heads, ranks, device=device, dtype=torch.long) if ranks else None
        use_ckpt = settings.checkpoint_chunks and torch.is_grad_enabled()  # see TargetWithHeads: memory vs recompute
        chunk_size = settings.chunk_size
        loss = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, flat.shape[0], chunk_size):
            chunk_context = None if context is None else context[start : start + chunk_size]
            states = _head_states(heads, flat[start : start + chunk_size], chunk_context)
            chunk_targets = targets[start : start + chunk_size]
            for k, state in enumerate(states):
                tk = chunk_targets[:, k]
                keep = (tk != IGNORE).nonzero().squeeze(-1)
                if keep.numel() == 0:
                    continue
                fn = partial(_project_ce, heads, k, settings.topk, ranks)
                args = (state[keep], tk[keep])
                ce, c1, ck, by_rank = checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args)
                loss = loss + weights[k] * ce
                ce_sum[k] += ce.detach()
                top1[k] += c1
                hits[k] += ck
                if rank_hits is not None:
                    rank_hits[k] += by_rank

        # A head with no target in this batch still has to take part in the graph: DDP and ZeRO
        # expect a gradient (zero here) for every trainable parameter on every step.
        idle = [k for k in range(num_heads) if int(count[k]) == 0]
        if idle and torch.is_grad_enabled():
            probe = hidden.reshape(-1, hidden.shape[-1])[:1]
            states = _head_states(heads, probe, None if context is None else input_ids.new_zeros(1, num_heads))
            for k in idle:
                loss = loss + 0.0 * heads.project(states[k], k).float().sum()
        return HeadLossOutput(
            loss=loss, ce_sum=ce_sum, count=count.to(torch.long), top1=top1, topk=hits, rank_hits=rank_hits,
            labels=input_ids,
        )

    def counts(self, heads: torch.nn.Module, batch: LossBatch) -> torch.Tensor:
        return medusa_target_counts(batch.input_ids, heads.config.num_heads, batch.loss_mask, batch.attention_mask,
                                    batch.position_ids)


def _weights(decay: float, count: torch.Tensor, denominators: torch.Tensor | None) -> list[float]:
    """``decay**k / n_k``: n_k this batch's count of head k's targets, or the given denominator."""
    n = count.tolist() if denominators is None else denominators.tolist()
    return [decay**k / n[k] if n[k] > 0 else 0.0 for k in range(len(n))]


def medusa_target_counts(
    input_ids: torch.Tensor,
    num_heads: int,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[K]``: how many positions of the batch have a target for head k (the loss's denominators),
    from the masks alone (no model)."""
    return (medusa_targets(input_ids, num_heads, loss_mask, attention_mask, position_ids) != IGNORE).sum((0, 1))
