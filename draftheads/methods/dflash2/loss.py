"""The DFlash2 training loss: DFlash's blocks and unary loss, plus the candidate selector's.

The blocks, their mask, the slot weights and the unary term (each slot's LM-head logits scored
against the target with `heads.loss`) are DFlash's (methods/dflash/loss.py), the convolution
inside the layers being part of the one draft forward. The selector is trained as speculators 0.8
trains it (speculators/models/dflash2/metrics.py, `compute_selector_loss`) and SpecForge PR
#772 describes: over each slot's top ``selector_top_k`` unary candidates (no gradient through the
choice), a K-way cross-entropy of the selector scores towards the target's greedy token, with the
predecessor teacher-forced (the data's token before the slot's label). Where the target's token is
not among the candidates it replaces the weakest one, for the loss only. That term is
slot-weighted like the unary one and added with weight ``heads.selector_alpha`` (default 1.0).

The rank hits logged (evaluation's simulated acceptance) rank the selector's scores over the
strict candidates, teacher-forced: what decoding drafts after a right prefix.
"""
from __future__ import annotations

from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from ...train.target_loss import TargetRows, needs_distribution, row_losses
from ..dflash.loss import DFlashLoss, SlotTerms, TrainedSlots


def _dflash2_chunk(heads, labels: TargetRows, width: int, kind: str, state, positions, previous):
    target_top, _, p, _ = labels.rows(positions)
    logits = heads.logits(state).float()
    rows = row_losses(kind, logits, p if needs_distribution(kind) else None, target_top)
    k = heads.selector_top_k
    with torch.no_grad():
        candidates = logits.topk(k, dim=-1).indices  # the serving candidate set
        present = candidates == target_top[:, None]
        inside = present.any(-1)
        label = torch.where(inside, present.long().argmax(-1), torch.full_like(target_top, k - 1))
        trained = candidates.clone()
        trained[:, -1] = torch.where(inside, candidates[:, -1], target_top)
    scores = heads.candidate_scores(state, logits.gather(-1, trained), previous, trained).float()
    selector = torch.nn.functional.cross_entropy(scores, label, reduction="none")
    with torch.no_grad():
        strict = heads.candidate_scores(state, logits.gather(-1, candidates), previous, candidates)
        order = candidates.gather(-1, strict.argsort(-1, descending=True))[:, :width]
        hit = order == target_top[:, None]
        if hit.shape[1] < width:  # ranks past the candidates are never drafted
            hit = torch.cat([hit, hit.new_zeros(hit.shape[0], width - hit.shape[1])], dim=1)
    return rows, selector, hit


class DFlash2Loss(DFlashLoss):
    """DFlash2 heads: DFlash's blocks and unary loss plus the selector's K-way CE (module docstring)."""

    def slot_terms(self, heads: torch.nn.Module, labels: TargetRows, flat: TrainedSlots, topk: int, ranks: int,
                   kind: str) -> SlotTerms:
        fn = partial(_dflash2_chunk, heads, labels, max(topk, ranks), kind)
        use_ckpt = self.settings.checkpoint_chunks and torch.is_grad_enabled()
        size = self.settings.chunk_size
        parts = []
        for start in range(0, flat.states.shape[0], size):
            args = (flat.states[start : start + size], flat.target[start : start + size], flat.previous[start : start + size])
            parts.append(checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args))
        if parts:
            rows, selector, hit = (torch.cat(col) for col in zip(*parts))
        else:
            rows = selector = flat.states.new_zeros(0, dtype=torch.float32)
            hit = torch.zeros(0, max(topk, ranks), dtype=torch.bool, device=flat.states.device)
        return SlotTerms(rows, hit, [(float(heads.config.extra.get("selector_alpha", 1.0)), selector)])
