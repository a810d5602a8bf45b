"""The DFlash training loss: random blocks per row, all of a row's blocks in ONE draft forward.

Per row, up to ``num_anchors`` anchors a are drawn (without replacement) from the positions
whose next token is a training token and whose whole block a..a+B-1 lies inside the row (the
last B-1 positions are never anchors: their blocks would run past the row). Block j is
``[token a_j, mask x (B-1)]`` at positions a_j..a_j+B-1; it attends to the context (the fused
target features) at positions < a_j and to its own block, nothing else: exactly what one
drafting step sees, whose root sits right after the committed context. Every block of the row
shares the context's keys/values, so the whole row is one forward over
``T + anchors x B`` keys.

Slot 0 (the anchor's own token) carries no loss. Slot k predicts token a+k against the target at
a+k-1 with `heads.loss`, the one option every draft-layer loss shares (train/target_loss.py: soft CE
against its distribution by default, KL = the same objective, CE on its greedy token, or LK),
counted where a+k is a training token. Slot k's mean loss weighs
w_k = exp(-(k-1)/gamma), and the weights are normalised to sum to 1 over the slots that had
any target (an early wrong slot ends acceptance, so the first slots matter most).

With ``greedy_path`` (``heads.greedy_path: true``) slot k counts only where the data's tokens
a+1..a+k-1 are the target's own greedy tokens (`greedy_follows`). A block's slots never see the
tokens before them, and verification accepts slot k only after slots 1..k-1 matched the target's
greedy tokens; where the data went another way, slot k's label is the target's prediction after
a token that drafting never conditions on, noise for what verification asks. Each slot's sum is
then divided by the number of blocks (not by its own count), so a slot weighs as often as it is
reached. Off, every slot of every block counts, each slot's mean weighing w_k (the published
recipe, trained on target-generated text where the two agree).

The anchors are drawn in the forward from the caller's generator (the loop reseeds it per
batch, so a resumed run draws the same blocks); the loss is therefore a mean over this
micro-batch's blocks, not over the optimizer step's (the masks alone do not say how many
blocks a step will draw). Vocab-sized logits are computed in checkpointed chunks of
``chunk_size`` rows, never for every block at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from ...train.head_loss import HeadLoss, HeadLossOutput, LossBatch
from ...train.target_loss import TargetRows, greedy_follows, loss_of, row_losses
from ...train.packing import document_ids, positions_or_arange, within_document


def anchor_candidates(input_ids, loss_mask, attention_mask, block: int, position_ids=None) -> torch.Tensor:
    """[B, S] bool: positions a that may anchor a block (next token trained, block inside the row,
    and inside one document of a packed window)."""
    bsz, seq = input_ids.shape
    lm = torch.ones_like(input_ids, dtype=torch.bool) if loss_mask is None else loss_mask.bool()
    am = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    ok = torch.zeros(bsz, seq, dtype=torch.bool, device=input_ids.device)
    if seq < block:
        return ok
    last = seq - block + 1  # a + B - 1 <= S - 1
    ok[:, :last] = am[:, :last] & am[:, block - 1 :] & lm[:, 1 : last + 1]
    if block > 1:
        ok[:, :last] = within_document(ok[:, :last], position_ids, block - 1)
    return ok


def draw_anchors(candidates: torch.Tensor, count: int, generator: torch.Generator | None):
    """(anchors [B, N] long, valid [B, N] bool): up to ``count`` distinct candidate positions per row,
    in increasing order; rows with fewer candidates pad with invalid anchors at position 0."""
    bsz, seq = candidates.shape
    scores = torch.rand(bsz, seq, generator=generator, device=candidates.device)
    scores = torch.where(candidates, scores, torch.full_like(scores, 2.0))  # non-candidates last
    n = min(count, seq)
    picked = scores.topk(n, dim=-1, largest=False).indices
    valid = candidates.gather(1, picked)
    anchors = torch.where(valid, picked, torch.zeros_like(picked))
    order = torch.where(valid, anchors, torch.full_like(anchors, seq)).argsort(-1)
    return anchors.gather(1, order), valid.gather(1, order)


def block_mask(
    anchors: torch.Tensor, valid: torch.Tensor, context_ok: torch.Tensor, block: int, documents: torch.Tensor | None = None
) -> torch.Tensor:
    """[B, N*block, S + N*block] bool: block j sees context positions < a_j (attended ones, of its
    anchor's document when ``documents`` [B, S] numbers a packed window's documents) and itself."""
    bsz, n = anchors.shape
    seq = context_ok.shape[1]
    pos = torch.arange(seq, device=anchors.device)
    ctx = (pos[None, None, :] < anchors[:, :, None]) & context_ok[:, None, :]  # [B, N, S]
    if documents is not None:
        ctx = ctx & (documents[:, None, :] == documents.gather(1, anchors)[:, :, None])
    ctx = ctx.repeat_interleave(block, dim=1)  # [B, N*block, S]
    own = torch.arange(n, device=anchors.device).repeat_interleave(block)
    same = (own[:, None] == own[None, :])[None].expand(bsz, -1, -1)
    return torch.cat([ctx, same], dim=-1)


@dataclass
class TrainedSlots:
    """The slots a batch trains, flat: each one's final-normed draft state [m, H], the target's
    window position it is scored against [m] (flat over [B, S]), its draft index 0..K-1 [m] and the
    data's token just before its label [m] (what a family conditioning on the previous token is
    teacher-forced with)."""

    states: torch.Tensor
    target: torch.Tensor
    slot: torch.Tensor
    previous: torch.Tensor


@dataclass
class SlotTerms:
    """A loss's per-slot terms: ``rows`` [m] the distribution loss (with grad), ``hit`` [m, width]
    rank hits against the target's greedy token, ``extra`` (weight, rows [m]) further terms, each
    slot-weighted like ``rows`` and added with its weight."""

    rows: torch.Tensor
    hit: torch.Tensor
    extra: list[tuple[float, torch.Tensor]] = field(default_factory=list)


def _chunk_terms(heads, labels: TargetRows, topk: int, ranks: int, kind: str, state, positions):
    """The `heads.loss` of each ``state`` row against the target at its window position."""
    target_top, _, p, _ = labels.rows(positions)
    logits = heads.logits(state).float()
    rows = row_losses(kind, logits, p, target_top)
    with torch.no_grad():
        width = max(topk, ranks)
        order = logits.topk(min(width, logits.shape[-1]), -1).indices
        hit = order == target_top[:, None]  # [n, width]
    return rows, hit


class DFlashLoss(HeadLoss):
    """DFlash heads: random blocks per row, each drafted in one forward under the block mask, against
    the target's distribution (or greedy token). Reads ``batch.features`` [B, S, m*H] (the fused
    layers' hidden states), ``batch.hidden`` [B, S, H] (the target's final hidden states: its
    distribution), ``batch.input_ids`` [B, S]. ``batch.ranks`` > 0 (evaluation): also count hits
    per rank r < ranks for the simulated acceptance of a tree. ``batch.position_ids``: a packed
    window's per-document positions (each block inside, and attending to, one document). The loss
    is the slot-weighted mean of the slots' mean losses over this batch's blocks
    (``batch.denominators`` is not read: which blocks are drawn is known only here)."""

    def __call__(self, heads: torch.nn.Module, batch: LossBatch) -> HeadLossOutput:
        input_ids, slots = batch.input_ids, heads.config.num_heads
        bsz, seq = input_ids.shape
        device = input_ids.device
        kind = loss_of(heads.config.extra)
        lm = torch.ones_like(input_ids, dtype=torch.bool) if batch.loss_mask is None else batch.loss_mask.bool()
        am = torch.ones_like(input_ids, dtype=torch.bool) if batch.attention_mask is None else batch.attention_mask.bool()
        states, label_pos, valid = _block_states(heads, batch, lm, am, self._anchor_generator(heads, batch))
        n = valid.shape[1]

        # Draft d of block j predicts token a_j + d, against the target at a_j + d - 1.
        labels = TargetRows(heads.target_lm_head(), batch.hidden, self.label_kind(heads, kind),
                            chunk_size=self.settings.chunk_size)
        counted = _counted_slots(heads, labels, valid, lm, am, label_pos, input_ids)
        slot_of = torch.arange(slots, device=device).expand(bsz, n, slots)
        idx = counted.reshape(-1).nonzero().squeeze(-1)
        src = (label_pos - 1).reshape(bsz, -1) + torch.arange(bsz, device=device)[:, None] * seq
        flat = TrainedSlots(
            states=states.reshape(-1, states.shape[-1])[idx],
            target=src.reshape(-1)[idx],  # the target's position of each trained slot, flat over [B, S]
            slot=slot_of.reshape(-1)[idx],
            previous=input_ids.reshape(-1)[src.reshape(-1)[idx]],  # the data's token before each slot's label
        )
        topk, ranks = self.settings.topk, batch.ranks
        terms = self.slot_terms(heads, labels, flat, topk, ranks, kind)
        rows, hit, flat_slot = terms.rows, terms.hit, flat.slot
        count = torch.bincount(flat_slot, minlength=slots)
        ce_sum = torch.zeros(slots, device=device).index_add(0, flat_slot, rows.detach())
        top1 = torch.bincount(flat_slot[hit[:, 0]], minlength=slots) if hit.shape[1] else torch.zeros_like(count)
        topk_hits = torch.bincount(flat_slot[hit[:, :topk].any(-1)], minlength=slots)
        rank_hits = None
        if ranks:
            rank_hits = torch.stack([torch.bincount(flat_slot[hit[:, r]], minlength=slots) for r in range(ranks)], dim=1)
        loss = _weighted_loss(heads, rows, flat_slot, count, states)
        for weight, extra_rows in terms.extra:  # the families' own terms (DSpark's confidence, DFlash2's selector)
            loss = loss + weight * _weighted_loss(heads, extra_rows, flat_slot, count, states)
        return HeadLossOutput(loss=loss, ce_sum=ce_sum, count=count, top1=top1, topk=topk_hits, rank_hits=rank_hits)

    def label_kind(self, heads: torch.nn.Module, kind: str) -> str:
        """The loss kind the target's labels are computed for (a family whose own terms read the
        target's whole distribution asks for it even when ``kind`` is ``ce``)."""
        return kind

    def slot_terms(self, heads: torch.nn.Module, labels: TargetRows, flat: "TrainedSlots", topk: int, ranks: int,
                   kind: str) -> "SlotTerms":
        """Each trained slot's loss and rank hits (DFlash: the target's LM head on the slot's state,
        against the target at its position), in checkpointed chunks."""
        rows, hit = _row_terms(heads, labels, flat.states, flat.target, topk, ranks, kind, self.settings.chunk_size,
                               self.settings.checkpoint_chunks)
        return SlotTerms(rows, hit)

    @staticmethod
    def _anchor_generator(heads: torch.nn.Module, batch: LossBatch) -> torch.Generator | None:
        """Where the random anchors come from: the batch's generator in training (reseeded per batch),
        a fixed seed in evaluation (every evaluation scores the same blocks)."""
        if heads.training:
            return batch.generator
        return torch.Generator(device=batch.input_ids.device).manual_seed(0)

    def counts(self, heads: torch.nn.Module, batch: LossBatch) -> torch.Tensor:
        return dflash_target_counts(heads, batch.input_ids, batch.loss_mask, batch.attention_mask, batch.position_ids)


def _block_states(heads, batch: LossBatch, lm: torch.Tensor, am: torch.Tensor, generator: torch.Generator | None):
    """Draw the blocks (anchors) of every row and run them in ONE draft forward: the states of the
    draft slots ``[B, N, K, H]``, the positions of the tokens they draft ``[B, N, K]`` (a+1..a+K) and
    which drawn anchors are real."""
    input_ids, position_ids, block = batch.input_ids, batch.position_ids, heads.block_size
    bsz, seq = input_ids.shape
    candidates = anchor_candidates(input_ids, lm, am, heads.span, position_ids)
    anchors, valid = draw_anchors(candidates, int(heads.config.extra.get("num_anchors", 32)), generator)
    n = anchors.shape[1]
    offsets = torch.arange(block, device=input_ids.device)
    drafted = torch.arange(1, heads.config.num_heads + 1, device=input_ids.device)
    label_pos = (anchors[:, :, None] + drafted).clamp(max=seq - 1)  # [B, N, K]; invalid anchors stay in range
    tokens = heads.block_inputs(input_ids.gather(1, anchors))  # [B, N, block]
    documents = None if position_ids is None else document_ids(position_ids, input_ids)
    mask = block_mask(anchors, valid, am, block, documents)

    context = heads.context(batch.features)
    rope = positions_or_arange(position_ids, input_ids)  # each token's position in its document
    context_kv = heads.context_kv(context, rope)
    block_positions = rope.gather(1, anchors)[:, :, None] + offsets
    states = heads.block_states(tokens.view(bsz, n * block), block_positions.view(bsz, n * block), context_kv, mask)
    return states.view(bsz, n, block, -1)[:, :, heads.draft_slots], label_pos, valid


def _counted_slots(heads, labels: TargetRows, valid, lm, am, label_pos, input_ids) -> torch.Tensor:
    """[B, N, K]: which slots of which drawn blocks are trained: a valid anchor, a loss token at the
    label, and (``greedy_path``) only after k-1 data tokens the target itself would produce."""
    bsz, n, slots = label_pos.shape
    flat = label_pos.reshape(bsz, -1)
    counted = valid[:, :, None] & lm.gather(1, flat).view(bsz, n, slots) & am.gather(1, flat).view(bsz, n, slots)
    if heads.config.extra.get("greedy_path", False):
        follows = greedy_follows(labels, input_ids)
        on_path = follows.gather(1, flat).view(bsz, n, slots)
        before = torch.ones_like(on_path)
        before[:, :, 1:] = on_path[:, :, :-1].long().cumprod(-1).bool()
        counted &= before
    return counted


def _row_terms(heads, labels: TargetRows, flat_states, flat_target, topk: int, ranks: int, kind: str, chunk_size: int,
               checkpoint_chunks: bool = True):
    """Each trained slot's loss and its rank hits, in chunks under activation checkpointing (the
    full-vocabulary logits of every slot would not fit at once)."""
    fn = partial(_chunk_terms, heads, labels, topk, ranks, kind)
    use_ckpt = checkpoint_chunks and torch.is_grad_enabled()  # see TargetWithHeads: memory vs recompute
    row_losses, hits = [], []
    for start in range(0, flat_states.shape[0], chunk_size):
        args = (flat_states[start : start + chunk_size], flat_target[start : start + chunk_size])
        rows, hit = checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args)
        row_losses.append(rows)
        hits.append(hit)
    width = max(topk, ranks)
    rows = torch.cat(row_losses) if row_losses else flat_states.new_zeros(0, dtype=torch.float32)
    hit = torch.cat(hits) if hits else torch.zeros(0, width, dtype=torch.bool, device=flat_states.device)
    return rows, hit


def _weighted_loss(heads, rows: torch.Tensor, flat_slot: torch.Tensor, count: torch.Tensor, states: torch.Tensor):
    """The slot-weighted mean of the slots' mean losses (exp(-(k-1)/gamma) weights)."""
    slots, device = count.shape[0], count.device
    weights = heads.slot_weights(device)
    per_slot = torch.zeros(slots, device=device, dtype=torch.float32).index_add(0, flat_slot, rows)
    present = count > 0
    if not bool(present.any()):  # no block in this batch: a zero loss that still touches every parameter (DDP)
        return states.sum() * 0.0
    w = weights * present
    # greedy_path: every slot's sum over the blocks (slot 1's count), so a slot weighs as often as
    # verification reaches it; its own count would let a few on-path blocks of a deep slot weigh as
    # much as every block of slot 1.
    den = count[:1].expand_as(count) if heads.config.extra.get("greedy_path", False) else count
    return (w * per_slot / den.clamp(min=1)).sum() / w.sum()


def dflash_target_counts(heads, input_ids, loss_mask=None, attention_mask=None, position_ids=None) -> torch.Tensor:
    """``[K]``: the candidate anchors of this batch per slot (an upper bound of the positions each
    slot is trained on; the blocks are drawn in the forward, see the module docstring)."""
    cand = anchor_candidates(input_ids, loss_mask, attention_mask, heads.span, position_ids)
    return cand.sum().expand(heads.config.num_heads).clone()
