"""EAGLE / EAGLE-3 drafting for a batch: one draft-layer forward per depth for all rows.

Forking one `EagleProposer` per row runs rows x depths small forwards per step, where kernel
launches, not FLOPs, set the cost. Here the rows share one draft KV cache [rows, kv, slots, hd]:
- catch-up: each row feeds the positions committed since its last step (a different number per
  row: accepted counts differ, prompts differ at the first step), padded to the longest; the
  padding slots become holes that the row's mask hides (``visible`` [rows, slots]). Positions are
  per row (each row's own committed count), so holes never shift RoPE.
- expansion: `eagle_tree.grow` with every row's visibility mask; each row gets the tree its own
  `EagleProposer` would draft (same code, only the cache layout differs).
- holes are removed (one gather of the draft cache, each row's entries then contiguous from slot
  0: right-padded with per-row lengths) when rows leave the batch, and by the ``compaction``
  policy (`inference.compaction`, the decoder's ``compaction``).
"""
from __future__ import annotations

import torch

from ..compaction import check_compaction, wants_compaction
from ..tree import Tree, chain_shape
from .eagle_tree import draw_chain, grow, nodes_up_to, select
from .sampled import chains
from .feed import FeedRows
from .draft_cache import grown


class EagleRows(FeedRows):
    """Batched form of an `EagleProposer`: per row, the same tree as that row's own forked proposer."""

    def __init__(self, proposer, compaction: str = "auto") -> None:  # an `eagle.EagleProposer` (eagle imports this module)
        self.proposer, self.compaction = proposer, check_compaction(compaction, "EAGLE draft-cache compaction")
        self.feature_layers = proposer.feature_layers
        self.head = proposer.head
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.compactions = 0
        self.max_excess = 0

    @property
    def device(self) -> torch.device:
        return self.proposer.device

    def start(self, prompts, hidden, params, generator) -> None:
        self.start_feed(prompts, hidden)
        # Committed draft-cache positions per row: host ints, also each row's visible slots (holes excluded).
        self._lengths = [0] * len(prompts)
        # [rows, slots] on the host: the layout is host bookkeeping (no device reads to plan a step)
        self._visible = torch.zeros(len(prompts), 0, dtype=torch.bool)
        self._cache = None
        self._reserve(max(len(ids) for ids in self._ids) + 256)
        self._params, self._generator = params, generator

    def keep(self, rows: list[int]) -> None:
        """Drop the rows that left; the same copy of the draft cache removes the holes."""
        self.keep_feed(rows)
        self._lengths = [self._lengths[r] for r in rows]
        self._gather(torch.tensor(rows, dtype=torch.long))

    def stats(self) -> dict:
        return {**self.proposer.stats(), "draft_cache": {"compaction": self.compaction, "compactions": self.compactions,
                                                         "max_excess_slots": self.max_excess}}

    # -- the draft cache --------------------------------------------------------------------------
    def _reserve(self, slots: int) -> None:
        """Room for ``slots`` slots in the preallocated buffers (doubling, keeping the used ones)."""
        w = self.head.fc.weight
        rows = self._visible.shape[0]
        self._cache = grown(self._cache, self._visible.shape[1], slots,
                            lambda capacity: self.head.new_cache(capacity, w.device, w.dtype, rows=rows))

    def _gather(self, rows: torch.Tensor | None = None) -> None:
        """Keep ``rows`` (all when None) with their visible slots moved to the front, in order:
        the cache becomes as long as the longest row, with no holes inside any row."""
        visible = self._visible if rows is None else self._visible[rows]
        counts = visible.sum(dim=1)
        width = int(counts.max()) if visible.shape[0] else 0
        # Stable sort: visible slots first, in their order; then the holes.
        order = torch.sort((~visible).long(), dim=1, stable=True).indices[:, :width]
        capacity = self._cache[0][0].shape[2]
        new = self.head.new_cache(capacity, self._cache[0][0].device, self._cache[0][0].dtype, rows=visible.shape[0])
        for (nk, nv), (ok, ov) in zip(new, self._cache):
            for dst, src in ((nk, ok), (nv, ov)):
                if rows is not None:
                    src = src.index_select(0, rows.to(src.device))
                idx = order.to(src.device)[:, None, :, None].expand(-1, src.shape[1], -1, src.shape[3])
                dst[:, :, :width] = src.gather(2, idx)
        self._cache = new
        self._visible = torch.arange(width)[None] < counts[:, None]
        self.compactions += 1

    def _excess(self) -> int:
        """Slots a compaction would remove: the cache is longer than its longest row."""
        return self._visible.shape[1] - max(self._lengths, default=0)

    # -- one step ---------------------------------------------------------------------------------
    def _catch_up(self, roots: list[int], drafting: list[bool]) -> torch.Tensor:
        """Feed each drafting row's newly committed positions (rows not drafting feed none and keep
        theirs pending, as their own proposer would); return the draft state at each row's root [rows, d]."""
        dev, rows = self.device, len(roots)
        feats, counts = self.take_pending(drafting, dev)  # padded to the longest (a row's padding: holes)
        if any(d and not c for d, c in zip(drafting, counts)):
            raise RuntimeError("EAGLE drafting again before `accepted`: a row has no new position to feed")
        m, prefix = max(counts), self._visible.shape[1]
        self._reserve(prefix + m + self.proposer.top_k * self.proposer.depth + 1)
        # Per row the token after each fed position (the root after the last), and each position's
        # number, built on the host as lists: one tensor each, not a tensor op per row.
        nxt = [self._ids[r][self._lengths[r] + 1 :] + [roots[r]] if c else [] for r, c in enumerate(counts)]
        nxt = torch.tensor([row + [0] * (m - len(row)) for row in nxt])
        g, attn_in = self.head.first_input(feats, nxt.to(dev))
        positions = torch.tensor([list(range(length, length + m)) for length in self._lengths]).to(dev)
        causal = torch.ones(m, m, dtype=torch.bool, device=dev).tril()  # padding never precedes a real position
        visible = self._visible.to(dev, non_blocking=True)
        mask = torch.cat([visible[:, None].expand(rows, m, prefix), causal.expand(rows, m, m)], dim=2)
        state, _ = self.head.run_layers(g, attn_in, positions, mask, cache=self._cache, cache_length=prefix)
        new = torch.tensor([[j < c for j in range(m)] for c in counts], dtype=torch.bool)
        self._visible = torch.cat([self._visible, new], dim=1)
        self._lengths = [length + c for length, c in zip(self._lengths, counts)]
        last = torch.tensor([max(c - 1, 0) for c in counts]).to(dev, non_blocking=True)
        return state[torch.arange(rows, device=dev), last]

    @torch.inference_mode()
    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        p = self.proposer
        depths = [0 if p.total_tokens == 1 else min(p.depth, d) for d in max_depths]
        drafting = [d >= 1 for d in depths]
        if not any(drafting):  # nothing to draft (total_tokens=1 = plain decoding)
            return [Tree(chain_shape(0), torch.tensor([root])) for root in roots]
        root_states = self._catch_up(roots, drafting)
        excess = self._excess()
        self.max_excess = max(self.max_excess, excess)
        if wants_compaction(self.compaction, excess, self._visible.shape[1]):
            self._gather()
        visible = self._visible.to(self.device, non_blocking=True)
        first_pos = torch.tensor(self._lengths).to(self.device, non_blocking=True)
        if self._params.draws_drafts:  # a drawn chain (`sampled`) as deep as the tree, within its token budget
            depths = [min(d, p.total_tokens - 1) for d in depths]
            drafts, laws = draw_chain(self.head, p._logits, p._vocab_ids_dev, self._cache, visible, first_pos,
                                      root_states, max(depths), self._params, self._generator)
            return chains(roots, drafts, laws, depths)
        tokens, parents, scores = grow(self.head, p._logits, p._vocab_ids_dev, self._cache, visible, first_pos,
                                       root_states, max(depths), p.top_k)
        # A row drafting shallower keeps only its first levels' nodes (what its own proposer grows).
        nodes = [nodes_up_to(max(d, 1), p.top_k) for d in depths]
        trees = select(roots, tokens, parents, scores, nodes, p.total_tokens, p._vocab_ids_dev)
        return [tree if d >= 1 else Tree(chain_shape(0), torch.tensor([root])) for tree, d, root in zip(trees, depths, roots)]
