"""DFlash drafting: one draft forward per step fills a block; its slots give a chain or a tree.

Each step:
1. catch up: the newly committed positions' target features become context (fc, hidden_norm,
   then every layer's k_proj/v_proj, k_norm and RoPE at their positions), appended to the draft
   cache. The cache holds ONLY context keys/values, as vLLM's drafter does: the block's own
   keys/values are dropped after the step.
2. one forward over the block ``[root, mask x K]`` at positions n..n+K (n = committed tokens,
   the root's position), attending to all the context and bidirectionally within the block.
3. slot d's logits rank the candidates of depth d. The chain takes each slot's best token (what
   engines draft, K = block_size - 1); a static tree of rank paths (Medusa's format: ``[0, 1]`` =
   slot 1's best token, then slot 2's second best) takes slot d's rank-r token for a node at depth
   d of rank r, at no extra draft forward. A block's slots do not read each other's tokens, so a
   node's candidates depend on its depth only, as with Medusa heads.
The block is always run whole, even when fewer tokens are wanted near ``max_new_tokens``: with
bidirectional attention a shorter block would change every slot's output. Drafts are
deterministic picks (point masses), so sampling stays exact.

``draft_vocab_size`` (as for Medusa): the slots are scored by the target LM head's rows of the N
most frequent training tokens only (`DraftHeads.draft_vocab`), and draft indices map back to
target ids (``vocab_ids``). A vocabulary-sized LM head over K slots is a large share of a small
draft's cost: about a quarter on the retired 5M demo target, which N = 1024 saves
(commit 19f3628's benchmarks/measurements/dflash-vocab/README.md). The restriction only changes which tokens can be
drafted, never the output. The target verifies every token, and drawn drafts carry their law over
the target vocabulary, zero outside the draft vocabulary.

A batch runs every row's block in that ONE forward (`DFlashDrafter`): the rows' contexts share one
cache, each row's entries from slot 0 (`row_cache`), and a row's block is masked off the slots
past its own context; catch-up projects every row's new positions in one call too.
"""
from __future__ import annotations

import torch

from ...plans import StaticTree
from ...inference.tree import TreeShape, static_shape
from ...inference.proposers.parallel import ParallelDrafter
from ...inference.proposers.row_cache import RowCache


def chain_choices(length: int) -> list[list[int]]:
    """The chain of ``length`` drafted tokens as rank paths."""
    return [[0] * d for d in range(1, length + 1)]


class DFlashDrafter(ParallelDrafter):
    """Every row's block in one forward, over a shared context cache (`row_cache.RowCache`)."""

    def __init__(self, heads: torch.nn.Module, tree: StaticTree | list[list[int]] | TreeShape | None = None,
                 draft_vocab_size: int | None = None) -> None:
        """``tree``: rank paths (None: the chain of the whole block); ``draft_vocab_size``: rank
        only the N most frequent training tokens (None, or >= the vocabulary: all of them)."""
        self.heads = heads.eval()
        ex, w = heads.config.extra, heads.fc.weight

        def empty(capacity: int, rows: int):
            shape = (rows, ex["num_key_value_heads"], capacity, ex["head_dim"])
            return [(w.new_empty(shape), w.new_empty(shape)) for _ in heads.layers]

        super().__init__(RowCache(empty))
        slots = heads.config.num_heads
        self.shape = static_shape(chain_choices(slots) if tree is None else tree, "dflash heads")
        if self.shape.max_depth > slots:
            raise ValueError(
                f"the tree is {self.shape.max_depth} deep but these dflash heads draft {slots} tokens per block "
                f"(block_size {heads.block_size}): use a tree at most {slots} deep"
            )
        if draft_vocab_size is not None and (isinstance(draft_vocab_size, bool) or not isinstance(draft_vocab_size, int)
                                             or draft_vocab_size < 1):
            raise ValueError(f"draft_vocab_size must be a positive integer (None: the whole vocabulary), got {draft_vocab_size!r}")
        self.draft_vocab_size = draft_vocab_size
        ids = heads.draft_vocab(draft_vocab_size)
        self.vocab_ids = None if ids is None else ids.to(self.device)  # draft index -> target id
        drafted = heads.config.vocab_size if ids is None else ids.numel()
        rank = max(self.shape.ranks[1:], default=-1)
        if rank >= drafted:  # topk would fail in the first decode step
            raise ValueError(
                f"the tree takes rank {rank}, but these heads draft from {drafted} tokens "
                f"({'the whole vocabulary' if ids is None else f'draft_vocab_size {drafted}'}): ranks are 0..{drafted - 1}"
            )
        self._rows = None  # the LM head's rows of the draft vocabulary, taken once (as Medusa's projections)
        if ids is not None:
            head = heads.target_lm_head()
            rows = ids.to(head.weight.device)
            self._rows = (head.weight.detach()[rows].contiguous(),
                          None if head.bias is None else head.bias.detach()[rows].contiguous())
        heads.mask_token_id  # noqa: B018 - refuses heads without a mask token now, not in the first step
        self.feature_layers = tuple(heads.feature_layers)
        self.vocab_size = heads.config.vocab_size

    @property
    def device(self) -> torch.device:
        return self.heads.fc.weight.device

    def describe(self, forwards: int) -> dict:
        return {"dflash": {"block_size": self.heads.block_size, "tree_nodes": self.shape.size, "draft_forwards": forwards,
                           "draft_vocab_size": None if self.vocab_ids is None else int(self.vocab_ids.numel())}}

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Scores of ``states`` [.., H] over the draft vocabulary [.., V'] (the target's LM head,
        restricted to ``vocab_ids``' rows when there is a draft vocabulary)."""
        if self._rows is None:
            return self.heads.logits(states)
        weight, bias = self._rows
        return torch.nn.functional.linear(states.to(weight.dtype), weight, bias)

    def target_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft-vocabulary ``indices``."""
        return indices if self.vocab_ids is None else self.vocab_ids.to(indices.device)[indices]

    @torch.inference_mode()
    def block_logits(self, roots: list[int]) -> torch.Tensor:
        """[rows, block_size, V'] logits (V' = the draft vocabulary, `target_ids` maps it) of every
        row's block after its committed context (slot 0, the root's, is not a draft): what the
        acceptance tables rank."""
        self.forwards += 1
        return self.logits(self.block_states(roots, [True] * len(roots)))

    @torch.inference_mode()
    def draft_logits(self, roots: list[int]) -> torch.Tensor:
        """[rows, K, V']: the logits of every row's draft slots (draft d at index d-1), from its block."""
        return self.block_logits(roots)[:, self.heads.draft_slots]

    def _catch_up(self, drafting: list[bool]) -> None:
        """The context keys/values of the drafting rows' newly committed positions, each at its own
        positions (a context entry reads only its own feature: no attention, no mask)."""
        feats, counts = self.take_pending(drafting, self.device)
        if feats is None:  # nothing committed since the last block (a second look at one root)
            return
        m, cache = feats.shape[1], self.cache
        cache.reserve(cache.width + m)
        positions = torch.tensor(cache.lengths).to(self.device, non_blocking=True)[:, None] + torch.arange(m, device=self.device)
        cache.append(self.heads.context_kv(self.heads.context(feats), positions), counts)

    def block_states(self, roots: list[int], drafting: list[bool]) -> torch.Tensor:
        """Final-normed draft states [rows, block, H] of every row's block ``[root, mask x K]`` at
        positions n..n+K (n = the row's committed tokens), each row attending to its own context."""
        self._catch_up(drafting)
        lengths = self.cache.lengths
        for r, d in enumerate(drafting):
            if d and lengths[r] != len(self._ids[r]):
                raise RuntimeError(f"dflash context of row {r} holds {lengths[r]} positions, {len(self._ids[r])} are committed")
        heads, dev = self.heads, self.device
        block = heads.block_size
        tokens = heads.block_inputs(torch.tensor(roots, device=dev))
        positions = torch.tensor(lengths).to(dev, non_blocking=True)[:, None] + torch.arange(block, device=dev)
        visible = self.cache.visible(dev)
        mask = None
        if visible is not None:  # a row sees its own context and its whole block
            rows = len(roots)
            mask = torch.cat([visible[:, None].expand(rows, block, -1),
                              torch.ones(rows, block, block, dtype=torch.bool, device=dev)], dim=2)
        return heads.block_states(tokens, positions, self.cache.prefix(), mask)

    def draft_states(self, roots: list[int], depths: list[int]) -> torch.Tensor:
        """[rows, D, H]: the final-normed states of the draft slots 1..D (D = the deepest row's)."""
        states = self.block_states(roots, [d > 0 for d in depths])
        first = self.heads.first_slot
        return states[:, first : first + max(depths)]

    def scores(self, roots: list[int], depths: list[int]) -> torch.Tensor:
        """The whole block runs (its attention is bidirectional: fewer mask slots would change every
        slot), the LM head scores only the draft slots of depths 1..D."""
        return self.logits(self.draft_states(roots, depths))

