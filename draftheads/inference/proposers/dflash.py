"""DFlash proposer: one draft forward per step fills a block; its slots give a chain or a tree.

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
"""
from __future__ import annotations

import statistics
import time

import torch

from ..sampling import SamplingParams
from ..tree import Tree, TreeShape
from .base import Proposer
from .draft_cache import grown
from .rank_table import rank_hit_table
from .sampled import drawn_block

INITIAL_CAPACITY = 256  # context rows beyond the prompt before the cache grows (doubling)


def chain_choices(length: int) -> list[list[int]]:
    """The chain of ``length`` drafted tokens as rank paths."""
    return [[0] * d for d in range(1, length + 1)]


class DFlashProposer(Proposer):
    def __init__(self, heads: torch.nn.Module, tree: list[list[int]] | TreeShape | None = None) -> None:
        self.heads = heads.eval()
        slots = heads.config.num_heads
        if isinstance(tree, dict):
            raise ValueError(
                "dflash heads draft a static tree from one block's per-slot ranks: pass a list of rank paths such as "
                "[[0], [0, 0], [1]], not dynamic-tree settings"
            )
        if tree is None:
            tree = chain_choices(slots)
        self.shape = tree if isinstance(tree, TreeShape) else TreeShape.from_choices(tree)
        if self.shape.max_depth > slots:
            raise ValueError(
                f"the tree is {self.shape.max_depth} deep but these dflash heads draft {slots} tokens per block "
                f"(block_size {heads.block_size}): use a tree at most {slots} deep"
            )
        rank = max(self.shape.ranks[1:], default=-1)
        if rank >= heads.config.vocab_size:
            raise ValueError(f"the tree takes rank {rank}, but the vocabulary has {heads.config.vocab_size} tokens")
        heads.mask_token_id  # noqa: B018 - refuses heads without a mask token now, not in the first step
        self.feature_layers = tuple(heads.feature_layers)
        self._layouts: dict[int, tuple[TreeShape, torch.Tensor, torch.Tensor, int]] = {}
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._cached = 0
        self._drafts = 0

    @property
    def device(self) -> torch.device:
        return self.heads.fc.weight.device

    def fork(self) -> "DFlashProposer":
        """Its own context cache (`start` reuses buffers large enough)."""
        clone = super().fork()
        clone._cache, clone._cached = None, 0
        return clone

    def start(self, input_ids, hidden, params: SamplingParams, generator) -> None:
        self._length = int(input_ids.numel())
        self._pending = [hidden]
        self._cached = 0
        self._drafts = 0
        self._ensure_capacity(self._length + INITIAL_CAPACITY)
        self._params, self._generator = params, generator

    def accepted(self, tokens, hidden) -> None:
        self._length += int(tokens.numel())
        self._pending.append(hidden)

    def stats(self) -> dict:
        return {"dflash": {"block_size": self.heads.block_size, "tree_nodes": self.shape.size, "draft_forwards": self._drafts}}

    # -- the context cache -------------------------------------------------------------------------
    def _ensure_capacity(self, rows: int) -> None:
        ex = self.heads.config.extra
        w = self.heads.fc.weight

        def empty(capacity: int):
            shape = (1, ex["num_key_value_heads"], capacity, ex["head_dim"])
            return [(w.new_empty(shape), w.new_empty(shape)) for _ in self.heads.layers]

        self._cache = grown(self._cache, self._cached, rows, empty)

    def _catch_up(self) -> None:
        """Append the context keys/values of the positions committed since the last step."""
        if not self._pending:
            return
        feats = torch.cat(self._pending).to(self.device)
        self._pending = []
        m, start = feats.shape[0], self._cached
        self._ensure_capacity(start + m)
        positions = torch.arange(start, start + m, device=self.device)[None]
        for (keys, values), (k, v) in zip(self._cache, self.heads.context_kv(self.heads.context(feats[None]), positions)):
            keys[:, :, start : start + m] = k
            values[:, :, start : start + m] = v
        self._cached = start + m

    def _layout(self, max_depth: int) -> tuple[TreeShape, torch.Tensor, torch.Tensor, int]:
        """For the shape cut at ``max_depth``: the slot and rank of every drafted node, and the top-k needed."""
        if max_depth not in self._layouts:
            shape = self.shape.truncated(max_depth)
            slot = shape.depth[1:].to(self.device)  # depth d reads block slot d
            rank = torch.tensor(shape.ranks[1:], dtype=torch.long, device=self.device)
            self._layouts[max_depth] = (shape, slot, rank, max(shape.ranks[1:], default=0) + 1)
        return self._layouts[max_depth]

    # -- one step ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def block_logits(self, root: int) -> torch.Tensor:
        """[block_size, V] logits of one block rooted at ``root`` after the committed context
        (row 0, the root's slot, is not a draft)."""
        return self.heads.logits(self._block_states(root))[0]

    @torch.inference_mode()
    def slot_logits(self, root: int, depth: int) -> torch.Tensor:
        """[depth, V] logits of slots 1..depth only: the whole block still runs (its attention is
        bidirectional), but the vocabulary-sized LM head, most of a small draft's cost, scores only
        the slots a tree of that depth reads."""
        return self.heads.logits(self._block_states(root)[0, 1 : depth + 1])

    def _block_states(self, root: int) -> torch.Tensor:
        self._catch_up()
        if self._cached != self._length:
            raise RuntimeError(f"dflash context holds {self._cached} positions, {self._length} are committed")
        heads = self.heads
        block = heads.block_size
        tokens = heads.block_inputs(torch.tensor([root], device=self.device))
        positions = torch.arange(self._cached, self._cached + block, device=self.device)[None]
        context = [(k[:, :, : self._cached], v[:, :, : self._cached]) for k, v in self._cache]
        self._drafts += 1
        return heads.block_states(tokens, positions, context, None)

    def propose(self, root: int, max_depth: int) -> Tree:
        shape, slot, rank, top = self._layout(max_depth)
        if shape.size == 1:
            return Tree(shape, torch.tensor([root]))
        logits = self.slot_logits(root, shape.max_depth)
        if self._params.draws_drafts:
            return drawn_block(root, logits, self._params, self._generator, None, self.heads.config.vocab_size)
        candidates = logits.topk(top, dim=-1).indices  # [depth, top]: row d-1 ranks slot d
        drafted = candidates[slot - 1, rank]
        root_t = torch.tensor([root]).to(drafted.device, non_blocking=True)
        return Tree(shape, torch.cat([root_t, drafted]))


def dflash_proposer(heads: torch.nn.Module, tree: list[list[int]] | TreeShape | None = None) -> DFlashProposer:
    """The proposer for dflash heads: ``tree`` (rank paths) if given, else the chain of block_size - 1."""
    return DFlashProposer(heads, tree=tree)


def measure_block_seconds(heads: torch.nn.Module, context: int = 64, repeats: int = 10) -> float:
    """Median seconds of one drafting step (the block forward and its drafted slots' logits) after
    ``context`` committed positions: the cost of every tree these heads draft, whatever its shape."""
    proposer = DFlashProposer(heads)
    param = heads.fc.weight
    features = torch.randn(context, heads.fc.in_features, device=param.device, dtype=param.dtype)
    proposer.start(torch.zeros(context, dtype=torch.long), features, SamplingParams(), None)
    samples = []
    for rep in range(repeats + 1):
        t0 = time.perf_counter()
        proposer.slot_logits(0, heads.config.num_heads)
        if param.device.type == "cuda":
            torch.cuda.synchronize()
        if rep:  # the first call also fills the context cache
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def block_accuracy_table(
    target: torch.nn.Module, heads: torch.nn.Module, sequences: list[torch.Tensor], max_rank: int = 10,
    skip_prompt: list[int] | None = None,
) -> torch.Tensor:
    """acc[k, r] = P(slot k+1's rank-r token == the token k+1 after the root) over the roots of
    ``sequences`` (the target's own greedy continuations: "correct" = what verification accepts),
    each block drafted exactly as decoding drafts it (the committed context before the root)."""
    def ranked(proposer, token: int, ranks: int) -> torch.Tensor:
        logits = proposer.block_logits(token)[1:]
        return logits.topk(min(ranks, logits.shape[-1]), dim=-1).indices

    return rank_hit_table(target, heads, sequences, lambda: DFlashProposer(heads), ranked, max_rank, skip_prompt)
