"""The DSpark training loss: DFlash's random blocks, the Markov bias teacher-forced, plus the
confidence head's calibration term.

The blocks, their mask and the slot weights are DFlash's (methods/dflash/loss.py): up to
``num_anchors`` blocks per row in ONE draft forward, draft d weighing exp(-(d-1)/gamma). On top:

- each draft's logits are the base logits plus the Markov bias of the token before its label in
  the data (the anchor for the first draft): teacher forcing, as speculators 0.8 and DeepSpec
  train it (DSparkDraftModel.forward; deepspec/modeling/dspark/qwen3/modeling.py). Those logits
  are scored against the target with `heads.loss` (soft CE by default: speculators' ``kl_div``
  objective, whose gradient it is);
- the confidence head is trained with binary cross-entropy towards ``sum_x min(q(x), p(x))`` =
  1 - TV(q, p), the probability that lossless speculative sampling accepts a draft drawn from q
  (detached), slot-weighted like the distribution term and added with weight
  ``heads.confidence_alpha`` (default 1.0, speculators' ``confidence_head_alpha``). Its input
  is the draft's state and (``confidence_with_markov``) the Markov embedding of the token before.

Not built: DeepSpec's default distribution term 0.1 CE + 0.9 L1 (on probabilities); `heads.loss`
covers CE and the acceptance-rate losses instead.
"""
from __future__ import annotations

from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from ...train.target_loss import TargetRows, needs_distribution, row_losses
from ..dflash.loss import DFlashLoss, SlotTerms, TrainedSlots


def _dspark_chunk(heads, labels: TargetRows, width: int, kind: str, confidence: bool, state, positions, previous):
    target_top, _, p, _ = labels.rows(positions)
    logits = (heads.logits(state) + heads.markov_bias(previous).to(state.dtype)).float()
    rows = row_losses(kind, logits, p if needs_distribution(kind) else None, target_top)
    if confidence:
        with torch.no_grad():
            accept = torch.minimum(logits.softmax(-1), p).sum(-1).clamp(0.0, 1.0)
        conf = torch.nn.functional.binary_cross_entropy_with_logits(heads.confidence_logits(state, previous), accept,
                                                                    reduction="none")
    else:
        conf = rows.new_zeros(rows.shape)
    with torch.no_grad():
        order = logits.topk(min(width, logits.shape[-1]), -1).indices
        hit = order == target_top[:, None]
    return rows, conf, hit


class DSparkLoss(DFlashLoss):
    """DSpark heads: DFlash's blocks with the Markov bias teacher-forced, plus the confidence term
    (module docstring). Reads what `DFlashLoss` reads."""

    def label_kind(self, heads: torch.nn.Module, kind: str) -> str:
        # the confidence target needs the target's whole distribution, whatever the main loss
        return "soft_ce" if heads.confidence_head is not None and not needs_distribution(kind) else kind

    def slot_terms(self, heads: torch.nn.Module, labels: TargetRows, flat: TrainedSlots, topk: int, ranks: int,
                   kind: str) -> SlotTerms:
        confidence = heads.confidence_head is not None
        fn = partial(_dspark_chunk, heads, labels, max(topk, ranks), kind, confidence)
        use_ckpt = self.settings.checkpoint_chunks and torch.is_grad_enabled()
        size = self.settings.chunk_size
        parts = []
        for start in range(0, flat.states.shape[0], size):
            args = (flat.states[start : start + size], flat.target[start : start + size], flat.previous[start : start + size])
            parts.append(checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args))
        if parts:
            rows, conf, hit = (torch.cat(col) for col in zip(*parts))
        else:
            rows = conf = flat.states.new_zeros(0, dtype=torch.float32)
            hit = torch.zeros(0, max(topk, ranks), dtype=torch.bool, device=flat.states.device)
        extra = [(float(heads.config.extra.get("confidence_alpha", 1.0)), conf)] if confidence else []
        return SlotTerms(rows, hit, extra)
