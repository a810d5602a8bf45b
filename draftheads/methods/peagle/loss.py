"""P-EAGLE training loss: every trained depth of many positions in ONE draft forward.

Element (anchor t, depth d) is what drafting computes at slot d after a root at position t+1:
- depth 0 reads the target's feature at t and token t+1 (EAGLE-3's input), position t;
- depth d >= 1 reads the mask token and ``fc(mask_hidden)``, position t+d;
- it attends to the depth-0 elements of anchors <= t (the committed prefix) and to its own
  chain (anchor t, depths 1..d): at inference, the mask slots after the root.
Element (t, d) learns the target's distribution of token t+2+d (its final hidden state at t+1+d
through its LM head), restricted to the draft vocabulary like EAGLE-3.

With ``greedy_path`` (``heads.greedy_path: true``) depth d trains only where the data's tokens
t+2..t+1+d are the target's own greedy tokens: drafting never sees the tokens before a mask slot,
and verification accepts depth d only after the earlier depths matched the target's greedy
tokens, so elsewhere the label answers a prefix drafting never has (see methods/dflash/loss.py).

Which depths each position trains (COD sampling): depth 0 every position; depth d a random
``max(r^d, r_min)`` share of the positions (k_d = ceil of that times the row's supervised
positions), drawn among depth d-1's chains whose next target is supervised, so every chain is
contiguous. The sum over all elements is divided by the number of depth-0 elements (over the
whole optimizer step when the loop passes ``denominators``): deeper depths weigh less only
because fewer of them are drawn, as in speculators' P-EAGLE. Vocab-sized logits are computed in
checkpointed chunks.
"""
from __future__ import annotations

import math
from functools import partial

import torch
from torch.utils.checkpoint import checkpoint

from ..eagle.loss import eagle_target_counts
from ...train.head_loss import HeadLoss, HeadLossOutput, LossBatch
from ...train.target_loss import TargetRows, greedy_follows, loss_of, row_losses
from ...train.packing import document_ids, positions_or_arange, within_document


def cod_sizes(ratio: float, floor: float, depths: int, supervised: int) -> list[int]:
    """Elements drawn at each depth for ``supervised`` depth-0 positions (depth 0: all)."""
    return [supervised] + [math.ceil(max(ratio**d, floor) * supervised) for d in range(1, depths)]


def sample_chains(valid: torch.Tensor, sizes: list[int], generator: torch.Generator | None) -> list[torch.Tensor]:
    """Anchors [B, k_d] of each depth d >= 1 and whether each one is a real chain element [B, k_d].

    ``valid`` [B, D, n]: anchor t's depth-d target is supervised. Depth d draws (uniformly, per
    row) k_d anchors among those whose chain reached depth d-1 and whose depth-d target is
    supervised; rows with fewer candidates get padding entries (marked False)."""
    bsz, depths, n = valid.shape
    alive = torch.ones(bsz, n, dtype=torch.bool, device=valid.device)  # chains that reached depth d-1
    out = []
    for d in range(1, depths):
        candidates = alive & valid[:, d]
        k = min(sizes[d], int(candidates.sum(1).max()) if n else 0)
        if k == 0:
            break
        score = torch.rand(bsz, n, generator=generator, device=valid.device)
        score = torch.where(candidates, score, torch.full_like(score, -1.0))
        picked = score.topk(k, dim=1).indices.sort(dim=1).values
        real = candidates.gather(1, picked)
        out.append((picked, real))
        alive = torch.zeros_like(alive).scatter_(1, picked, real)
    return out


def element_states(
    heads: torch.nn.Module,
    features: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    chains: list[tuple[torch.Tensor, torch.Tensor]],
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One draft forward over every element: depth 0 at every anchor, then ``chains`` (per depth
    d >= 1: anchors [B, k_d] and which are real). Returns (states [B, N, d], anchor [B, N],
    depth [N], real [B, N]) along one element axis, depth by depth. ``position_ids``: a packed
    window's per-document positions (an element sees the prefix of its own document only)."""
    bsz, seq = input_ids.shape
    n, device = seq - 1, input_ids.device
    anchor = [torch.arange(n, device=device).expand(bsz, n)] + [picked for picked, _ in chains]
    real = [attention_mask[:, :n].bool()] + [r for _, r in chains]
    depth = torch.cat([torch.full((a.shape[1],), d, device=device) for d, a in enumerate(anchor)])
    anchor, real = torch.cat(anchor, 1), torch.cat(real, 1)
    g, attn_in = heads.first_input(features[:, :n], input_ids[:, 1:])
    rest = anchor.shape[1] - n
    if rest:
        gm, attn_m = heads.mask_input((bsz, rest))
        g, attn_in = torch.cat([g, gm.to(g.dtype)], 1), torch.cat([attn_in, attn_m.to(attn_in.dtype)], 1)
    # a slot's position is its anchor's (in its document) plus its depth
    positions = positions_or_arange(position_ids, input_ids).gather(1, anchor) + depth[None]
    first = depth == 0
    # the committed prefix: depth-0 elements of anchors <= mine (real tokens only)
    sees_prefix = first[None, None, :] & (anchor[:, None, :] <= anchor[:, :, None]) & real[:, None, :]
    if position_ids is not None:  # ... of my own document
        doc = document_ids(position_ids, input_ids).gather(1, anchor)
        sees_prefix = sees_prefix & (doc[:, None, :] == doc[:, :, None])
    # my own chain's mask slots up to my depth (depth-0 elements have none)
    own_chain = (anchor[:, None, :] == anchor[:, :, None]) & ~first[None, None, :] & ~first[None, :, None]
    own_chain &= depth[None, None, :] <= depth[None, :, None]
    # every element sees itself: padding rows would otherwise attend to nothing (NaN)
    mask = sees_prefix | own_chain | torch.eye(anchor.shape[1], dtype=torch.bool, device=device)[None]
    state, _ = heads.run_layers(g, attn_in, positions, mask)
    return state, anchor, depth, real


def _depth_terms(heads, labels: TargetRows, topk: int, ranks: int, state: torch.Tensor, positions: torch.Tensor):
    """Summed `heads.loss` (train/target_loss.py) against the target at window ``positions``, restricted
    to the draft vocabulary, top-1 / top-k / per-rank hits of the target's argmax; rows whose
    argmax is outside the vocabulary are left out."""
    kind = loss_of(heads.config.extra)
    target_top, inside, p, _ = labels.rows(positions)
    logits = heads.logits(state).float()
    ce = (row_losses(kind, logits, p, target_top) * inside).sum()
    with torch.no_grad():
        order = logits.topk(min(max(topk, ranks), logits.shape[-1]), -1).indices
        hit = (order == target_top[:, None]) & inside[:, None]
        top1, hits = hit[:, 0].sum(), hit[:, :topk].any(-1).sum()
        per_rank = torch.zeros(ranks, dtype=torch.long, device=state.device)
        width = min(ranks, hit.shape[1])
        per_rank[:width] = hit[:, :width].sum(0)
    return ce, top1, hits, inside.sum(), per_rank


class PEagleLoss(HeadLoss):
    """P-EAGLE heads: every trained depth in one draft forward, depths drawn by COD sampling.
    Reads ``batch.features`` [B, S, F] (fused target layers), ``batch.hidden`` [B, S, H] (the
    target's final hidden states: its distribution), ``batch.input_ids`` [B, S].
    ``batch.generator``: where COD sampling draws from (the loop reseeds it per batch, so a resumed
    run draws the same depths). ``batch.denominators``: `counts` over the optimizer step; its entry
    0 (the depth-0 elements) divides the summed loss. ``batch.ranks`` > 0: count hits per rank
    (evaluation). ``batch.position_ids``: a packed window's per-document positions (no chain
    crosses a document)."""

    def __call__(self, heads: torch.nn.Module, batch: LossBatch) -> HeadLossOutput:
        ex = heads.config.extra
        input_ids, position_ids = batch.input_ids, batch.position_ids
        am = torch.ones_like(input_ids, dtype=torch.bool) if batch.attention_mask is None else batch.attention_mask.bool()
        labels = TargetRows(heads.target_lm_head(), batch.hidden, loss_of(ex), heads.vocab_ids(), heads.target_to_draft,
                            self.settings.chunk_size)
        valid = _trained_depths(heads, labels, batch)
        sizes = cod_sizes(float(ex["cod_ratio"]), float(ex["cod_min_ratio"]), heads.config.num_heads,
                          int(valid[:, 0].sum(1).max()))
        chains = sample_chains(valid, sizes, batch.generator)
        state, anchor, depth, real = element_states(heads, batch.features, input_ids, am, chains, position_ids)
        total, sums = self._depth_sums(heads, labels, batch, valid, state, anchor, depth, real)
        den = float(batch.denominators[0]) if batch.denominators is not None else float(valid[:, 0].sum())
        loss = total / den if den > 0 else 0.0 * total
        return HeadLossOutput(loss=loss, **sums)

    def _depth_sums(self, heads, labels: TargetRows, batch: LossBatch, valid, state, anchor, depth, real):
        """The summed loss over every trained element, and the per-depth figures for the stats."""
        depths, seq, device, ranks = heads.config.num_heads, batch.input_ids.shape[1], batch.input_ids.device, batch.ranks
        chunk_size = self.settings.chunk_size
        sums = dict(ce_sum=torch.zeros(depths, device=device), count=torch.zeros(depths, device=device, dtype=torch.long),
                    top1=torch.zeros(depths, device=device, dtype=torch.long),
                    topk=torch.zeros(depths, device=device, dtype=torch.long),
                    rank_hits=torch.zeros(depths, ranks, device=device, dtype=torch.long) if ranks else None)
        total = state.new_zeros((), dtype=torch.float32)
        use_ckpt = self.settings.checkpoint_chunks and torch.is_grad_enabled()  # see TargetWithHeads: memory vs recompute
        fn = partial(_depth_terms, heads, labels, self.settings.topk, ranks)
        for d in range(depths):
            cols = (depth == d).nonzero().squeeze(-1)
            if cols.numel() == 0:
                continue
            a = anchor[:, cols]
            target_ok = valid[:, d].gather(1, a) & real[:, cols]
            rows_b, rows_j = target_ok.nonzero(as_tuple=True)
            if rows_b.numel() == 0:
                continue
            flat_state = state[:, cols][rows_b, rows_j]
            flat_label = rows_b * seq + a[rows_b, rows_j] + 1 + d  # the target's position, flat over [B, S]
            for start in range(0, rows_b.numel(), chunk_size):
                args = (flat_state[start : start + chunk_size], flat_label[start : start + chunk_size])
                ce, c1, ck, inside, per_rank = checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args)
                total = total + ce
                sums["ce_sum"][d] += ce.detach()
                sums["count"][d] += inside
                sums["top1"][d] += c1
                sums["topk"][d] += ck
                if ranks:
                    sums["rank_hits"][d] += per_rank
        return total, sums

    def counts(self, heads: torch.nn.Module, batch: LossBatch) -> torch.Tensor:
        return eagle_target_counts(heads.config.num_heads, batch.input_ids, batch.loss_mask, batch.attention_mask,
                                   batch.position_ids)


def _trained_depths(heads, labels: TargetRows, batch: LossBatch) -> torch.Tensor:
    """``valid[b, d, t]``: anchor t's depth-d target (token t+2+d) is a training token (and, with
    ``greedy_path``, follows d data tokens the target itself would produce)."""
    input_ids, position_ids = batch.input_ids, batch.position_ids
    depths = heads.config.num_heads
    bsz, seq = input_ids.shape
    n = seq - 1  # anchors t = 0 .. S-2
    device = input_ids.device
    lm = torch.ones_like(input_ids, dtype=torch.bool) if batch.loss_mask is None else batch.loss_mask.bool()
    am = torch.ones_like(input_ids, dtype=torch.bool) if batch.attention_mask is None else batch.attention_mask.bool()
    supervised = lm & am
    valid = torch.zeros(bsz, depths, n, dtype=torch.bool, device=device)
    for d in range(depths):
        if 2 + d < seq:
            valid[:, d, : seq - 2 - d] = within_document(supervised[:, 2 + d :], position_ids, 2 + d)
    if heads.config.extra.get("greedy_path", False):  # depth d only after d data tokens the target itself would produce
        follows = greedy_follows(labels, input_ids)
        on_path = torch.ones(bsz, n, dtype=torch.bool, device=device)
        for d in range(1, depths):  # depth d's chain runs through tokens t+2 .. t+1+d
            if 1 + d < seq:
                on_path[:, : seq - 1 - d] &= follows[:, 1 + d :]
                on_path[:, seq - 1 - d :] = False
            valid[:, d] &= on_path
    return valid
