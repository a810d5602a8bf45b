"""EAGLE / EAGLE-3 training losses, unrolled over draft steps (training-time test).

Step 0 is EAGLE's teacher-forced step: row t reads the target's feature f_t and token t+1 and
predicts feature f_{t+1} (so token t+2). Step k > 0 feeds each row's own step k-1 output back
with token t+1+k and predicts for position t+1+k. Its attention sees, like a tree node at depth
k+1 at inference, the real prefix (step-0 rows <= t) and its own earlier steps (same row,
steps 1..k-1), nothing else: the training graph matches what drafting does.

Losses per step, averaged over the rows whose predicted token is a training token:
- eagle:  SmoothL1(predicted feature, f_{t+1+k}) + 0.1 x soft cross-entropy against the target's
  distribution (EAGLE-1), with uniform noise on the input features in training;
- eagle3: soft cross-entropy against the target's distribution restricted to the draft
  vocabulary, counted where the target's argmax lies in it (EAGLE-3; no feature loss).
Step k is weighted 0.8^k. Vocab-sized logits are computed in checkpointed chunks, never for the
whole batch at once (as in losses.py).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .losses import HeadLossOutput
from .packing import document_ids, positions_or_arange, within_document

SOFT_CE_WEIGHT = 0.1  # EAGLE-1: the classification loss is ~10x the regression loss


def _chunk_terms(heads, lm_head, topk: int, state: torch.Tensor, target_hidden: torch.Tensor):
    """Summed soft CE (and feature SmoothL1 for EAGLE) of draft states against the target, plus
    top-1 / top-k hit counts of the target's argmax; rows where the target's argmax is outside
    the draft vocabulary are left out (EAGLE-3)."""
    with torch.no_grad():
        target_logits = lm_head(target_hidden.to(lm_head.weight.dtype)).float()
        target_top = target_logits.argmax(-1)
        ids = heads.vocab_ids()  # EAGLE-3: its draft vocabulary's target ids; EAGLE: None
        if ids is not None:  # restrict to the draft vocabulary and renormalise
            inside = heads.target_to_draft[target_top] >= 0
            target_logits = target_logits[:, ids]
            target_top = heads.target_to_draft[target_top].clamp(min=0)
        else:
            inside = torch.ones_like(target_top, dtype=torch.bool)
        p = target_logits.softmax(-1)
    logits = heads.logits(state).float()
    ce_rows = -(p * logits.log_softmax(-1)).sum(-1)
    ce = (ce_rows * inside).sum()
    reg = logits.new_zeros(())
    if ids is None:
        reg = F.smooth_l1_loss(state.float(), target_hidden.float(), reduction="none").mean(-1).sum()
    with torch.no_grad():
        top1 = ((logits.argmax(-1) == target_top) & inside).sum()
        hits = ((logits.topk(min(topk, logits.shape[-1]), -1).indices == target_top[:, None]).any(-1) & inside).sum()
    return ce, reg, top1, hits, inside.sum()


def eagle_loss(
    heads: torch.nn.Module,
    features: torch.Tensor,
    last_hidden: torch.Tensor,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    decay: float = 0.8,
    chunk_size: int = 1024,
    topk: int = 5,
    noise_generator: torch.Generator | None = None,
    denominators: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> HeadLossOutput:
    """``features`` [B, S, F]: what the head reads (eagle: = ``last_hidden``; eagle3: fused layers);
    ``last_hidden`` [B, S, H]: the target's final hidden states (its distribution, EAGLE's feature
    label); ``input_ids`` [B, S] the data tokens. ``noise_generator``: where EAGLE's feature noise
    comes from (the loop reseeds it per batch so a resumed run draws the same noise; None: the
    global RNG). ``denominators`` [steps]: divide step k's summed terms by this instead of this
    batch's count of rows (the loop passes ``eagle_target_counts`` over the whole optimizer step:
    every micro-batch and process). ``position_ids``: a packed window's per-document positions:
    a row attends to the rows of its own document only, at its position in that document, and
    no step pairs a row with a token of another document."""
    steps = heads.config.num_heads
    bsz, seq = input_ids.shape
    n = seq - 1  # rows t = 0 .. S-2 (row t's first prediction is position t+1)
    device = input_ids.device
    lm = torch.ones_like(input_ids, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
    am = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    lm_head = heads.target_lm_head()
    regress = not heads.fuses_layers  # EAGLE-1/2 also regress onto the next feature; EAGLE-3 has none
    noise = float(heads.config.extra.get("noise", 0.0)) if regress else 0.0

    feats = features[:, :n]
    if heads.training and noise > 0:
        uniform = torch.rand(feats.shape, generator=noise_generator, device=feats.device, dtype=feats.dtype)
        feats = feats + (uniform - 0.5) * (2 * noise)
    rows = torch.arange(n, device=device)
    causal = (rows[None, :] <= rows[:, None])[None] & am[:, None, :n]  # [B, n, n]
    if position_ids is not None:
        doc = document_ids(position_ids, input_ids)[:, :n]
        causal = causal & (doc[:, None, :] == doc[:, :, None])
    row_positions = positions_or_arange(position_ids, input_ids)[:, :n]
    eye = torch.eye(n, dtype=torch.bool, device=device)[None].expand(bsz, n, n)

    def tokens_at(offset: int) -> torch.Tensor:  # input_ids[t + offset] for every row, 0 past the end
        out = input_ids.new_zeros(bsz, n)
        if offset < seq:
            out[:, : seq - offset] = input_ids[:, offset : offset + n][:, : seq - offset]
        return out

    ce_sum = torch.zeros(steps, device=device)
    count = torch.zeros(steps, device=device, dtype=torch.long)
    top1 = torch.zeros(steps, device=device, dtype=torch.long)
    hits = torch.zeros(steps, device=device, dtype=torch.long)
    loss = features.new_zeros((), dtype=torch.float32)
    use_ckpt = torch.is_grad_enabled()
    past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    state = None
    for k in range(steps):
        tokens = tokens_at(1 + k)
        if k == 0:
            g, attn_in = heads.first_input(feats, tokens)
            mask = causal
        else:
            g, attn_in = heads.next_input(state, tokens)
            mask = torch.cat([causal] + [eye] * k, dim=-1)
        positions = row_positions + k
        state, new_kv = heads.run_layers(g, attn_in, positions, mask, past)
        past = new_kv if past is None else [
            (torch.cat([pk, nk], 2), torch.cat([pv, nv], 2)) for (pk, pv), (nk, nv) in zip(past, new_kv)
        ]
        # Row t at step k predicts position t+1+k's feature (token t+2+k).
        shift = 2 + k
        if shift >= seq:
            continue
        valid = torch.zeros(bsz, n, dtype=torch.bool, device=device)
        valid[:, : seq - shift] = within_document(lm[:, shift:] & am[:, shift:], position_ids, shift)
        idx = valid.reshape(-1).nonzero().squeeze(-1)
        if idx.numel() == 0:
            continue
        flat_state = state.reshape(-1, state.shape[-1])[idx]
        label_hidden = torch.zeros(bsz, n, last_hidden.shape[-1], dtype=last_hidden.dtype, device=device)
        label_hidden[:, : seq - shift] = last_hidden[:, shift - 1 :][:, : seq - shift]
        flat_label = label_hidden.reshape(-1, last_hidden.shape[-1])[idx]
        step_ce = step_reg = loss.new_zeros(())
        step_count = 0
        for start in range(0, idx.numel(), chunk_size):
            fn = partial(_chunk_terms, heads, lm_head, topk)
            args = (flat_state[start : start + chunk_size], flat_label[start : start + chunk_size])
            ce, reg, c1, ck, inside = checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args)
            step_ce, step_reg = step_ce + ce, step_reg + reg
            step_count += int(inside)
            top1[k] += c1
            hits[k] += ck
        count[k] = step_count
        ce_sum[k] = step_ce.detach()
        if denominators is not None:  # the rows of the whole step (EAGLE-3: rows outside its vocabulary add 0)
            den = float(denominators[k])
            terms = step_reg + SOFT_CE_WEIGHT * step_ce if regress else step_ce
            step_loss = terms / den if den > 0 else 0.0 * terms
        elif regress:
            step_loss = (step_reg + SOFT_CE_WEIGHT * step_ce) / max(idx.numel(), 1)
        else:
            step_loss = step_ce / max(step_count, 1)
        loss = loss + decay**k * step_loss
    return HeadLossOutput(loss=loss, ce_sum=ce_sum, count=count, top1=top1, topk=hits)


def eagle_target_counts(
    steps: int,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[steps]``: the rows step k is trained on in this batch (those whose predicted token
    t+2+k is a training token), from the masks alone: the loss's denominators."""
    seq = input_ids.shape[1]
    lm = torch.ones_like(input_ids, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
    am = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    counts = torch.zeros(steps, dtype=torch.long, device=input_ids.device)
    for k in range(steps):
        shift = 2 + k
        if shift < seq:
            counts[k] = within_document(lm[:, shift:] & am[:, shift:], position_ids, shift).sum()
    return counts
