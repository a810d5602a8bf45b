"""P-EAGLE drafting: one draft forward per step gives the top-k of every draft position.

Each step runs the draft layers ONCE over
  [the positions committed since the last step (target feature t, token t+1), the root last,
   then max_depth - 1 mask slots (mask token, fc(mask_hidden)) at the next positions]
under causal attention, appending to the draft's KV cache (the layout vLLM's parallel drafting
feeds, see methods/peagle/heads.py). The root's slot scores draft position 1, mask slot j position j+1.
Only the committed rows stay in the cache: the mask slots' rows are overwritten next step.

The tree is static, as for Medusa: rank paths (``[[0], [0, 0], [0, 0, 0]]`` = the chain of 3,
what engines draft; ``[[0], [1], [0, 0]]`` adds position 1's second guess). A node at depth d of
rank r takes position d's r-th best token. Mask slots never see the tokens drafted before them,
so siblings' subtrees hold the same tokens: the tree only adds guesses, never a forward. Drafts
are deterministic picks (point masses for the verifier), so sampling stays exact.

A batch runs every row's step in that ONE forward (`PEagleDrafter`): rows feed different numbers of
committed positions, so each row's entries are padded to the longest, written after the longest
row's context, and the committed ones then move to the row's own end of the shared cache
(`row_cache`); a row attends to its own context only.
"""
from __future__ import annotations

import torch

from ...plans import StaticTree
from ...inference.tree import TreeShape, static_shape
from ...inference.proposers.parallel import ParallelDrafter
from ...inference.proposers.row_cache import RowCache


def peagle_drafter(head: torch.nn.Module, tree=None, draft_vocab_size: int | None = None) -> "PEagleDrafter":
    """The drafter for peagle heads (a ``draft_vocab_size`` option is refused: their vocabulary is trained)."""
    if draft_vocab_size is not None:
        raise ValueError(
            "peagle heads draft from their own trained vocabulary (draft_vocab_size in config.json); "
            "a draft_vocab_size option does not apply to them"
        )
    return PEagleDrafter(head, tree=tree)


class PEagleDrafter(ParallelDrafter):
    """Every row's catch-up and mask slots in one causal forward over a shared draft cache.
    ``tree``: rank paths or a TreeShape; None = the chain of all trained depths."""

    def __init__(self, head: torch.nn.Module, tree: StaticTree | list[list[int]] | TreeShape | None = None) -> None:
        self.head = head.eval()
        w = head.fc.weight
        super().__init__(RowCache(lambda capacity, rows: head.new_cache(capacity, w.device, w.dtype, rows=rows)))
        head.check_vocab_mapping()
        depths = head.config.num_heads
        self.shape = static_shape(StaticTree.chain(depths) if tree is None else tree, "peagle heads")
        if self.shape.max_depth > depths:
            raise ValueError(
                f"the tree is {self.shape.max_depth} deep but these peagle heads were trained for {depths} depths: "
                "use a shallower tree or heads trained with more depths (heads.num_heads)"
            )
        self.vocab_ids = head.vocab_ids().to(self.device)  # draft index -> target id
        rank = max(self.shape.ranks[1:], default=-1)
        if rank >= self.vocab_ids.numel():
            raise ValueError(f"the tree takes rank {rank}, but the heads draft from {self.vocab_ids.numel()} tokens")
        self.feature_layers = tuple(head.feature_layers)
        self.vocab_size = head.config.vocab_size
        self.step_slots = self.shape.max_depth

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def describe(self, forwards: int) -> dict:
        return {"peagle": {"tree_nodes": self.shape.size, "depth": self.shape.max_depth, "draft_forwards": forwards}}

    def _inputs(self, roots: list[int], drafting: list[bool], depth: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(residual stream, attention input) [rows, m + depth - 1, ..] of every row's step: its
        newly committed positions (feature t, token t+1; the root last), its ``depth - 1`` mask
        slots right after them, then padding to the longest row (padding never precedes a real
        entry, so a causal mask keeps it unseen); and each row's count of committed entries."""
        head, dev = self.head, self.device
        feats, counts = self.take_pending(drafting, self.device)
        m = 0 if feats is None else feats.shape[1]
        nxt = []
        for r, c in enumerate(counts):
            row = self._ids[r][self.cache.lengths[r] + 1 :] + [roots[r]] if drafting[r] else []
            if len(row) != c:
                raise RuntimeError(f"peagle draft cache of row {r} is out of step: {c} features for {len(row)} tokens")
            nxt.append(row + [0] * (m - c))
        g, attn_in = head.first_input(feats, torch.tensor(nxt).to(dev, non_blocking=True))
        if depth > 1:
            gm, attn_m = head.mask_input((len(roots), depth - 1))
            g, attn_in = torch.cat([g, gm.to(g.dtype)], 1), torch.cat([attn_in, attn_m.to(attn_in.dtype)], 1)
        if any(c != m for c in counts):  # each row's mask slots right after its own entries
            n = m + depth - 1
            order = torch.tensor([[*range(c), *range(m, n), *range(c, m)] for c in counts]).to(dev, non_blocking=True)
            g = g.gather(1, order[..., None].expand(-1, -1, g.shape[-1]))
            attn_in = attn_in.gather(1, order[..., None].expand(-1, -1, attn_in.shape[-1]))
        return g, attn_in, counts

    def scores(self, roots: list[int], depths: list[int]) -> torch.Tensor:
        """Every row's entries are written after the longest row's context (at ``prefix``), each
        row masked to its own context, then its committed entries move to its own end (the mask
        slots' entries are scratch)."""
        head, dev, cache = self.head, self.device, self.cache
        depth = max(depths)
        g, attn_in, counts = self._inputs(roots, [d > 0 for d in depths], depth)
        rows, n = g.shape[:2]
        m, prefix = n - depth + 1, cache.width
        cache.reserve(prefix + n)
        positions = torch.tensor(cache.lengths).to(dev, non_blocking=True)[:, None] + torch.arange(n, device=dev)
        causal = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        visible = cache.visible(dev)
        if visible is None:
            mask = torch.ones(rows, n, prefix + n, dtype=torch.bool, device=dev)
            mask[:, :, prefix:] = causal
        else:
            mask = torch.cat([visible[:, None].expand(rows, n, prefix), causal.expand(rows, n, n)], dim=2)
        state, _ = head.run_layers(g, attn_in, positions, mask, cache=cache.layers, cache_length=prefix)
        cache.settle(m, counts)  # the layers wrote every row's entries at prefix
        if all(c == m for c in counts):
            read = state[:, m - 1 : m - 1 + depth]
        else:  # each row's root entry, then its mask slots
            first = torch.tensor([max(c, 1) - 1 for c in counts]).to(dev, non_blocking=True)
            index = first[:, None] + torch.arange(depth, device=dev)
            read = state.gather(1, index[..., None].expand(-1, -1, state.shape[-1]))
        return head.logits(read).float()
