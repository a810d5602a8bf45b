"""EAGLE / EAGLE-3 training losses, unrolled over draft steps (training-time test).

Step 0 is EAGLE's teacher-forced step: row t reads the target's feature f_t and token t+1 and
predicts feature f_{t+1} (so token t+2). Step k > 0 feeds each row's own step k-1 output back
with token t+1+k and predicts for position t+1+k. Its attention sees, like a tree node at depth
k+1 at inference, the real prefix (step-0 rows <= t) and its own earlier steps (same row,
steps 1..k-1), nothing else: the training graph matches what drafting does.

Losses per step, averaged over the rows whose predicted token is a training token:
- eagle:  SmoothL1(predicted feature, f_{t+1+k}) + 0.1 x a classification term against the
  target (EAGLE-1), with uniform noise on the input features in training;
- eagle3: the classification term against the target's distribution restricted to the draft
  vocabulary, counted where the target's argmax lies in it (EAGLE-3; no feature loss).
The classification term is `heads.loss` (train/target_loss.py: soft cross-entropy by default, as both
papers; KL, CE on the target's greedy token, or LK's negative log acceptance). Step k is weighted
``decay``^k (`train.loss_decay`, 0.8 as EAGLE-3's trainer). The draft's vocab-sized logits are computed in
checkpointed chunks, never for the whole batch at once (as in methods/medusa/loss.py); the target's side of
every step (`TargetRows`) once per window position, since step k+1 scores step k's positions
shifted by one. The steps attend tile by tile (`heads/unrolled_attention.py`).
"""
from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ...heads.unrolled_attention import UnrolledStepMask, first_visible
from ...train.head_loss import HeadLoss, HeadLossOutput, LossBatch
from ...train.target_loss import TargetRows, loss_of, row_losses
from ...train.packing import document_ids, positions_or_arange, within_document

SOFT_CE_WEIGHT = 0.1  # EAGLE-1: the classification loss is ~10x the regression loss


def regresses(heads) -> bool:
    """Whether the heads also regress onto the next feature: EAGLE-1/2 do; EAGLE-3 (no single
    feature to regress onto) and heads that say ``regresses_features = False`` (MTP) do not."""
    return bool(getattr(heads, "regresses_features", not heads.fuses_layers))


def _chunk_terms(heads, labels: TargetRows, topk: int, state: torch.Tensor, positions: torch.Tensor):
    """Summed classification loss (`heads.loss`; and feature SmoothL1 for EAGLE) of draft states
    against the target at window ``positions``, plus top-1 / top-k hit counts of the target's
    argmax; rows where the target's argmax is outside the draft vocabulary are left out (EAGLE-3)."""
    kind = loss_of(heads.config.extra)
    target_top, inside, p, target_hidden = labels.rows(positions)
    logits = heads.logits(state).float()
    ce = (row_losses(kind, logits, p, target_top) * inside).sum()
    reg = logits.new_zeros(())
    if regresses(heads):
        reg = F.smooth_l1_loss(state.float(), target_hidden.float(), reduction="none").mean(-1).sum()
    with torch.no_grad():
        top1 = ((logits.argmax(-1) == target_top) & inside).sum()
        hits = ((logits.topk(min(topk, logits.shape[-1]), -1).indices == target_top[:, None]).any(-1) & inside).sum()
    return ce, reg, top1, hits, inside.sum()


class EagleLoss(HeadLoss):
    """EAGLE / EAGLE-3 heads unrolled over their draft steps. Reads ``batch.features`` [B, S, F]
    (what the head reads: eagle = ``batch.hidden``; eagle3: fused layers), ``batch.hidden``
    [B, S, H] (the target's final hidden states: its distribution, EAGLE's feature label) and
    ``batch.input_ids`` [B, S] (the data tokens). ``batch.generator``: where EAGLE's feature noise
    comes from (the loop reseeds it per batch so a resumed run draws the same noise; None: the
    global RNG). ``batch.denominators`` [steps]: divide step k's summed terms by this instead of
    this batch's count of rows (the loop passes `counts` over the whole optimizer step: every
    micro-batch and process). ``batch.position_ids``: a packed window's per-document positions: a
    row attends to the rows of its own document only, at its position in that document, and no
    step pairs a row with a token of another document."""

    def __call__(self, heads: torch.nn.Module, batch: LossBatch) -> HeadLossOutput:
        settings, features, input_ids = self.settings, batch.features, batch.input_ids
        steps = heads.config.num_heads
        ids = heads.vocab_ids()  # EAGLE-3: its draft vocabulary's target ids; EAGLE: None (the whole vocabulary)
        labels = TargetRows(heads.target_lm_head(), batch.hidden, loss_of(heads.config.extra), ids,
                            heads.target_to_draft if ids is not None else None, settings.chunk_size)
        regress = regresses(heads)  # EAGLE-1/2 also regress onto the next feature; EAGLE-3 and MTP do not
        rows = _UnrolledBatch(input_ids, batch.loss_mask, batch.attention_mask, batch.position_ids)
        feats = _input_features(heads, features[:, : rows.n], regress, batch.generator)
        totals = _StepTotals(steps, input_ids.device)
        loss = features.new_zeros((), dtype=torch.float32)
        use_ckpt = settings.checkpoint_chunks and torch.is_grad_enabled()  # see TargetWithHeads: memory vs recompute
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        state = None
        for k in range(steps):
            state, past = _unroll_step(heads, rows, k, feats, state, past)
            idx = rows.trained_rows(k)
            if idx is None:
                continue
            step_ce, step_reg, step_count = _step_sums(
                heads, labels, state.reshape(-1, state.shape[-1])[idx], rows.label_positions(k, idx), k, totals,
                settings.chunk_size, settings.topk, use_ckpt,
            )
            step = _step_loss(step_ce, step_reg, step_count, idx.numel(), regress, batch.denominators, k)
            loss = loss + settings.decay**k * step
        return HeadLossOutput(loss=loss, ce_sum=totals.ce_sum, count=totals.count, top1=totals.top1, topk=totals.hits)

    def counts(self, heads: torch.nn.Module, batch: LossBatch) -> torch.Tensor:
        return eagle_target_counts(heads.config.num_heads, batch.input_ids, batch.loss_mask, batch.attention_mask,
                                   batch.position_ids)


class _UnrolledBatch:
    """The rows of a batch as the unrolled draft steps see them: row t = 0 .. S-2 (row t's first
    prediction is position t+1), the attention masks of each step, and which rows step k trains."""

    def __init__(self, input_ids: torch.Tensor, loss_mask: torch.Tensor | None, attention_mask: torch.Tensor | None,
                 position_ids: torch.Tensor | None = None) -> None:
        self.position_ids = position_ids  # a packed window's per-document positions (None: one document per row)
        self.input_ids = input_ids
        self.bsz, self.seq = input_ids.shape
        self.n = n = self.seq - 1
        self.device = device = input_ids.device
        self.lm = torch.ones_like(input_ids, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
        self.am = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
        self.rows = torch.arange(n, device=device)
        self.causal = (self.rows[None, :] <= self.rows[:, None])[None] & self.am[:, None, :n]  # [B, n, n]
        if position_ids is not None:  # a row attends to the rows of its own document only
            doc = document_ids(position_ids, input_ids)[:, :n]
            self.causal = self.causal & (doc[:, None, :] == doc[:, :, None])
        self.positions = positions_or_arange(position_ids, input_ids)[:, :n]  # each row's position in its document
        self.starts = first_visible(self.causal)  # where each tile of queries starts reading the prefix

    def tokens_at(self, offset: int) -> torch.Tensor:
        """input_ids[t + offset] for every row, 0 past the end."""
        out = self.input_ids.new_zeros(self.bsz, self.n)
        if offset < self.seq:
            out[:, : self.seq - offset] = self.input_ids[:, offset : offset + self.n][:, : self.seq - offset]
        return out

    def mask(self, k: int) -> UnrolledStepMask:
        """Step k's attention: the real prefix (step-0 rows <= t) and the row's own earlier steps."""
        return UnrolledStepMask(self.causal, k, self.starts)

    def trained_rows(self, k: int) -> torch.Tensor | None:
        """Flat indices of the rows whose step-k prediction (token t+2+k) is a training token;
        None when there are none."""
        shift = 2 + k
        if shift >= self.seq:
            return None
        valid = torch.zeros(self.bsz, self.n, dtype=torch.bool, device=self.device)
        valid[:, : self.seq - shift] = within_document(self.lm[:, shift:] & self.am[:, shift:], self.position_ids, shift)
        idx = valid.reshape(-1).nonzero().squeeze(-1)
        return idx if idx.numel() else None

    def label_positions(self, k: int, idx: torch.Tensor) -> torch.Tensor:
        """Row t at step k predicts position t+1+k's feature (token t+2+k): the flat window
        positions (over [B, S]) of the rows ``idx`` (flat over [B, n]) for `TargetRows`."""
        return (idx // self.n) * self.seq + idx % self.n + 1 + k


class _StepTotals:
    """Per-step figures for the stats: summed soft CE, trained rows, top-1 and top-k hits."""

    def __init__(self, steps: int, device: torch.device) -> None:
        self.ce_sum = torch.zeros(steps, device=device)
        self.count = torch.zeros(steps, device=device, dtype=torch.long)
        self.top1 = torch.zeros(steps, device=device, dtype=torch.long)
        self.hits = torch.zeros(steps, device=device, dtype=torch.long)


def _input_features(heads, feats: torch.Tensor, regress: bool, generator: torch.Generator | None) -> torch.Tensor:
    """The target features the first step reads; EAGLE-1/2 add uniform noise to them in training."""
    noise = float(heads.config.extra.get("noise", 0.0)) if regress else 0.0
    if heads.training and noise > 0:
        uniform = torch.rand(feats.shape, generator=generator, device=feats.device, dtype=feats.dtype)
        feats = feats + (uniform - 0.5) * (2 * noise)
    return feats


def _unroll_step(heads, batch: _UnrolledBatch, k: int, feats: torch.Tensor, state, past):
    """Draft step k over every row: step 0 reads the target's features, step k > 0 its own step
    k-1 output; returns the new states and the keys/values of every step so far."""
    tokens = batch.tokens_at(1 + k)
    g, attn_in = heads.first_input(feats, tokens) if k == 0 else heads.next_input(state, tokens)
    state, new_kv = heads.run_layers(g, attn_in, batch.positions + k, batch.mask(k), past)
    past = new_kv if past is None else [
        (torch.cat([pk, nk], 2), torch.cat([pv, nv], 2)) for (pk, pv), (nk, nv) in zip(past, new_kv)
    ]
    return state, past


def _step_sums(heads, labels: TargetRows, flat_state, positions, k: int, totals: _StepTotals, chunk_size: int, topk: int,
               use_ckpt: bool):
    """Step k's summed soft CE and feature regression over its trained rows (window ``positions``),
    in checkpointed chunks of ``chunk_size`` rows (vocab-sized logits never for all rows at once);
    the counts go to ``totals``."""
    step_ce = step_reg = flat_state.new_zeros((), dtype=torch.float32)
    step_count = 0
    fn = partial(_chunk_terms, heads, labels, topk)
    for start in range(0, flat_state.shape[0], chunk_size):
        args = (flat_state[start : start + chunk_size], positions[start : start + chunk_size])
        ce, reg, c1, ck, inside = checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args)
        step_ce, step_reg = step_ce + ce, step_reg + reg
        step_count += int(inside)
        totals.top1[k] += c1
        totals.hits[k] += ck
    totals.count[k] = step_count
    totals.ce_sum[k] = step_ce.detach()
    return step_ce, step_reg, step_count


def _step_loss(step_ce, step_reg, step_count: int, rows: int, regress: bool, denominators, k: int):
    """Step k's loss: its summed terms over the step's denominator when given (the rows of the
    whole optimizer step; EAGLE-3: rows outside its vocabulary add 0), else over this batch's rows."""
    if denominators is not None:
        den = float(denominators[k])
        terms = step_reg + SOFT_CE_WEIGHT * step_ce if regress else step_ce
        return terms / den if den > 0 else 0.0 * terms
    if regress:
        return (step_reg + SOFT_CE_WEIGHT * step_ce) / max(rows, 1)
    return step_ce / max(step_count, 1)


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
