"""One KV cache for a batch whose rows advance by different amounts each step.

Every row shares the cache's physical length, but each row's valid entries are its own: the
slot table ``slot_pos`` [rows, slots] holds the logical position (what RoPE and windows see) of
each cache slot, or -1 for a hole (left padding, or a slot a row did not need this step). A
row's queries attend to its valid slots only, through a per-row 4D mask, with position ids that
count valid tokens, not slots. So holes cost attention over masked slots but never change a
result.

Holes appear when rows accept different numbers of tokens: the step's tree occupies n slots in
every row; `commit_rows` moves each row's accepted nodes to the front of that region and keeps
max(accepted) slots, so a row that accepted fewer leaves a few holes. `compact` removes all
holes (one gather of the whole cache); `keep_rows` drops finished rows (one copy of the rest).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..accepted import Acceptance
from ..compaction import check_compaction, wants_compaction
from ..masks import FULL, AttentionSpan, additive, span_visible
from ..recurrent import attention_layers, commit_states, keep_state_rows
from ..tree import Tree
from .base import KVStore, Prefilled, Verified


@dataclass
class RaggedState:
    """Where each row of the batch stands in the shared cache."""

    slot_pos: torch.Tensor  # [rows, slots] long: logical position per slot, -1 = hole
    next_pos: torch.Tensor  # [rows] long: logical position of each row's next token (its root)

    @property
    def slots(self) -> int:
        return self.slot_pos.shape[1]

    @property
    def holes(self) -> int:
        """Masked slots beyond each row's own left padding, summed over rows (what compaction saves)."""
        valid = int((self.slot_pos >= 0).sum())
        return self.slot_pos.numel() - valid - int(self.left_pad().sum())

    def left_pad(self) -> torch.Tensor:
        """Per row, the minimum left padding any layout needs: slots - valid tokens of the longest row."""
        valid = (self.slot_pos >= 0).sum(dim=1)
        return int(valid.max()) - valid


def prefill_state(attention_mask: torch.Tensor) -> tuple[RaggedState, torch.Tensor]:
    """Slot table and position ids of a left-padded prompt batch (positions as `generate` gives them)."""
    mask = attention_mask.long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0) * mask
    slot_pos = torch.where(mask.bool(), position_ids, torch.full_like(position_ids, -1))
    return RaggedState(slot_pos=slot_pos, next_pos=mask.sum(dim=1)), position_ids


def pad_trees(trees: list[Tree]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [rows, n] (where the trees' tokens are), depths [rows, n] and ancestor masks
    [rows, n, n] (on the host, read-only views when every row has the same shape) of trees padded to
    the largest one. A padding node is a copy of its row's root that sees only itself: it never
    influences a real node, and its query row is never fully masked (which would give NaN)."""
    n = max(t.shape.size for t in trees)
    rows = len(trees)
    shape = trees[0].shape
    # Tokens stay where the proposer drafted them (heads: on the device), so no host read here.
    if all(t.shape is shape for t in trees):  # one tree shape for every row (Medusa/Hydra): views
        return torch.stack([t.tokens for t in trees]), shape.depth.expand(rows, n), shape.ancestor_mask.expand(rows, n, n)
    tokens = torch.stack([torch.cat([t.tokens, t.tokens[:1].expand(n - t.shape.size)]) for t in trees])
    depth = torch.zeros(rows, n, dtype=torch.long)
    ancestors = torch.eye(n, dtype=torch.bool).repeat(rows, 1, 1)
    for r, tree in enumerate(trees):
        size = tree.shape.size
        depth[r, :size] = tree.shape.depth
        ancestors[r, :size, :size] = tree.shape.ancestor_mask
    return tokens, depth, ancestors


def ragged_mask(
    state: RaggedState,
    depth: torch.Tensor,
    ancestors: torch.Tensor,
    span: AttentionSpan,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Additive mask [rows, 1, n, slots + n]: each node sees its row's valid slots (within the
    span's window/chunk, by logical position) and its tree ancestors and itself. Built where the
    inputs are: the batched loop moves the slot table there, n times smaller than the mask."""
    q_pos = state.next_pos[:, None] + depth  # [rows, n]
    prefix = (state.slot_pos >= 0)[:, None, :].expand(-1, depth.shape[1], -1)  # [rows, n, slots]
    visible = torch.cat([prefix, ancestors], dim=2)
    if span != FULL:
        k_pos = torch.cat([state.slot_pos, q_pos], dim=1)[:, None, :]  # [rows, 1, slots + n]
        visible = span_visible(visible, q_pos[:, :, None], k_pos, span)
    return additive(visible, dtype)[:, None]


def _layers(cache) -> list:
    """The layers whose keys and values the slot table describes (a hybrid target's state layers have no
    slots: `recurrent.commit_states` and `keep_state_rows` keep their rows)."""
    return attention_layers(cache)


def tree_parents(trees: list[Tree], n: int) -> torch.Tensor:
    """[rows, n] each node's parent as `pad_trees` lays the trees out (padding nodes: -1, roots of their own)."""
    parents = torch.full((len(trees), n), -1, dtype=torch.long)
    for r, tree in enumerate(trees):
        parents[r, : tree.shape.size] = tree.shape.parents_tensor
    return parents


def commit_rows(cache, state: RaggedState, paths: list[list[int]], step_pos: torch.Tensor) -> RaggedState:
    """Keep each row's accepted nodes (``paths[r]``, tree node indices, root first, as acceptance
    brought them to the host) in the cache.

    The step's tree took n slots after ``state.slots`` in every row; accepted nodes move to the
    front of that region and the cache keeps max(accepted) of the n slots (views, no copy of the
    prefix). ``step_pos`` [rows] is each row's logical position of its root."""
    start = state.slots
    lengths = [len(p) for p in paths]
    kept = max(lengths)
    if any(p != list(range(len(p))) for p in paths):
        index = torch.tensor([p + [p[-1]] * (kept - len(p)) for p in paths])
        gathers: dict[tuple, torch.Tensor] = {}  # one index per (device, heads, head dim), not per layer
        for layer in _layers(cache):
            for name in ("keys", "values"):
                tensor = getattr(layer, name)
                key = (tensor.device, tensor.shape[1], tensor.shape[3])
                if key not in gathers:
                    gathers[key] = index.to(tensor.device)[:, None, :, None].expand(-1, key[1], -1, key[2])
                tensor[:, :, start : start + kept] = tensor[:, :, start:].gather(2, gathers[key])
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, : start + kept]
        layer.values = layer.values[:, :, : start + kept]
    offsets = torch.arange(kept)
    counts = torch.tensor(lengths)
    new_pos = torch.where(offsets[None] < counts[:, None], step_pos[:, None] + offsets[None], -1)
    return RaggedState(torch.cat([state.slot_pos, new_pos], dim=1), step_pos + counts)


def keep_rows(cache, state: RaggedState, rows: list[int], compact_too: bool = False) -> RaggedState:
    """The cache and slot table of ``rows`` only (finished rows stop costing verify tokens).
    With ``compact_too``, holes go in the same copy."""
    if compact_too:
        return compact(cache, state, rows)
    index = torch.tensor(rows, dtype=torch.long)
    for layer in _layers(cache):
        layer.keys = layer.keys.index_select(0, index.to(layer.keys.device))
        layer.values = layer.values.index_select(0, index.to(layer.values.device))
    return RaggedState(state.slot_pos[index], state.next_pos[index])


def compact(cache, state: RaggedState, rows: list[int] | None = None) -> RaggedState:
    """Gather every row's valid slots to the right end of a cache as long as the longest row
    (left padding only, no holes), optionally keeping only ``rows``: one copy of the cache."""
    slot_pos = state.slot_pos if rows is None else state.slot_pos[rows]
    next_pos = state.next_pos if rows is None else state.next_pos[rows]
    row_index = torch.arange(state.slot_pos.shape[0]) if rows is None else torch.tensor(rows, dtype=torch.long)
    valid = slot_pos >= 0
    counts = valid.sum(dim=1)
    width = int(counts.max())
    # Stable sort puts holes first and valid slots last, in order; keep the last `width` of each row.
    order = torch.sort(valid.long(), dim=1, stable=True).indices[:, -width:]
    new_pos = slot_pos.gather(1, order)
    for layer in _layers(cache):
        for name in ("keys", "values"):
            tensor = getattr(layer, name)
            picked = tensor.index_select(0, row_index.to(tensor.device))
            idx = order.to(tensor.device)[:, None, :, None].expand(-1, tensor.shape[1], -1, tensor.shape[3])
            setattr(layer, name, picked.gather(2, idx))
    return RaggedState(new_pos, next_pos)


class RaggedKV(KVStore):
    """A left-padded batch in one shared cache with per-row holes (see the module docstring):
    the KV store of `loop.py` for every batch but one unpadded row. ``compaction``: when holes
    are removed (`compaction.py`)."""

    def __init__(self, verifier, attention_mask: torch.Tensor, compaction: str = "auto") -> None:
        self.verifier, self.attention_mask = verifier, attention_mask
        self.compaction = check_compaction(compaction)
        self.cache = verifier.new_cache()
        self.state: RaggedState | None = None
        self._recorded = None  # the last verify forward's `recurrent.RecurrentStep` (hybrid targets)
        self.compactions = self.max_holes = 0
        self._compacted = False  # this step's drop of finished rows removed the holes already

    def prefill(self, input_ids: torch.Tensor) -> Prefilled:
        """The padded prompts [B, T], positions counted over real tokens as `generate` counts them."""
        self.state, position_ids = prefill_state(self.attention_mask)
        last, features = self.verifier.prefill(self.cache, input_ids, self.attention_mask, position_ids)
        width, device = input_ids.shape[1], self.verifier.device
        lengths = self.attention_mask.sum(dim=1).tolist()
        prompts = [input_ids[r, width - n:].to(device) for r, n in enumerate(lengths)]
        hidden = [None if features is None else features[r, width - n:] for r, n in enumerate(lengths)]
        return Prefilled(last, prompts, hidden)

    def _mask(self, depth: torch.Tensor, ancestors: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        """The 4D mask (or one per layer type) for this step, built on the device from the host's
        slot table: [rows, slots] positions travel, not [rows, n, slots] floats."""
        device, dtype = self.verifier.device, self.verifier.dtype
        state = RaggedState(self.state.slot_pos.to(device, non_blocking=True), self.state.next_pos.to(device, non_blocking=True))
        depth, ancestors = depth.to(device, non_blocking=True), ancestors.to(device, non_blocking=True)
        masks = {name: ragged_mask(state, depth, ancestors, span, dtype) for name, span in self.verifier.spans.items()}
        return next(iter(masks.values())) if len(masks) == 1 else masks

    def verify(self, trees: list[Tree]) -> Verified:
        tokens, depth, ancestors = pad_trees(trees)
        tokens = tokens.to(self.verifier.device)
        parents = tree_parents(trees, tokens.shape[1]) if self.verifier.recurrent is not None else None
        logits, features, self._recorded = self.verifier.forward_rows(
            self.cache, tokens, self.state.next_pos[:, None] + depth, self._mask(depth, ancestors), parents)
        return Verified(tokens, logits, features, self._recorded)

    def commit(self, accs: list[Acceptance]) -> None:
        self.state = commit_rows(self.cache, self.state, [acc.nodes for acc in accs], self.state.next_pos)
        if self._recorded is not None:
            commit_states(self.cache, self._recorded, [acc.nodes[-1] for acc in accs],
                          max(len(acc.nodes) for acc in accs))
            self._recorded = None
        self.max_holes = max(self.max_holes, self.state.holes)
        self._compacted = False

    def keep(self, rows: list[int]) -> None:
        """Only ``rows`` (positions in the batch) go on; unless compaction is off, the same copy
        removes the holes."""
        self._compacted = self.compaction != "never"
        self.state = keep_rows(self.cache, self.state, rows, compact_too=self._compacted)
        keep_state_rows(self.cache, torch.tensor(rows, dtype=torch.long))
        self.compactions += self._compacted

    def tidy(self) -> None:
        """After a step: remove the holes when the policy says they cost more than a copy."""
        if not self._compacted and wants_compaction(self.compaction, self.state.holes, self.state.slot_pos.numel()):
            self.state = compact(self.cache, self.state)
            self.compactions += 1
        self._compacted = False

    def stats(self) -> dict:
        return {"compaction": self.compaction, "compactions": self.compactions, "max_holes": self.max_holes}
