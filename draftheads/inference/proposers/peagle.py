"""P-EAGLE proposer: one draft forward per step gives the top-k of every draft position.

Each step runs the draft layers ONCE over
  [the positions committed since the last step (target feature t, token t+1), the root last,
   then max_depth - 1 mask slots (mask token, fc(mask_hidden)) at the next positions]
under causal attention, appending to the draft's KV cache (the layout vLLM's parallel drafting
feeds, see heads/peagle.py). The root's slot scores draft position 1, mask slot j position j+1.
Only the committed rows stay in the cache: the mask slots' rows are overwritten next step.

The tree is static, as for Medusa: rank paths (``[[0], [0, 0], [0, 0, 0]]`` = the chain of 3,
what engines draft; ``[[0], [1], [0, 0]]`` adds position 1's second guess). A node at depth d of
rank r takes position d's r-th best token. Mask slots never see the tokens drafted before them,
so siblings' subtrees hold the same tokens: the tree only adds guesses, never a forward. Drafts
are deterministic picks (point masses for the verifier), so sampling stays exact.
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

CACHE_HEADROOM = 256  # committed rows reserved beyond the prompt before the buffers grow


def peagle_proposer(head: torch.nn.Module, tree=None, draft_vocab_size: int | None = None) -> "PEagleProposer":
    if draft_vocab_size is not None:
        raise ValueError(
            "peagle heads draft from their own trained vocabulary (draft_vocab_size in config.json); "
            "a draft_vocab_size option does not apply to them"
        )
    return PEagleProposer(head, tree=tree)


class PEagleProposer(Proposer):
    """``tree``: rank paths or a TreeShape; None = the tree saved with the heads, else the chain
    of all trained depths."""

    def __init__(self, head: torch.nn.Module, tree: list[list[int]] | TreeShape | None = None) -> None:
        self.head = head.eval()
        head.check_vocab_mapping()
        depths = head.config.num_heads
        if tree is None:
            tree = head.tree if isinstance(head.tree, list) else [[0] * d for d in range(1, depths + 1)]
        if isinstance(tree, dict):
            raise ValueError(
                "peagle heads draft a static tree from one forward: pass rank paths such as [[0], [0, 0], [0, 0, 0]] "
                "(a chain of 3), not dynamic-tree settings"
            )
        self.shape = tree if isinstance(tree, TreeShape) else TreeShape.from_choices(tree)
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
        self._layouts: dict[int, tuple[TreeShape, torch.Tensor, torch.Tensor, int]] = {}
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._cached = 0  # draft-cache rows: committed positions whose (feature, next token) were fed
        self._steps = 0

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    # -- the per-sequence interface ------------------------------------------------------------------
    def start(self, input_ids, hidden, params: SamplingParams, generator) -> None:
        self._ids = input_ids.tolist()
        self._pending = [hidden]  # target features of committed positions not yet fed to the draft
        self._cached = 0
        self._steps = 0
        self._reserve(input_ids.numel() + CACHE_HEADROOM)
        self._params, self._generator = params, generator

    def accepted(self, tokens, hidden) -> None:
        self._ids.extend(tokens.tolist())
        self._pending.append(hidden)

    def fork(self) -> "PEagleProposer":
        """Its own draft KV buffers (`start` reuses them when large enough)."""
        clone = super().fork()
        clone._cache, clone._cached = None, 0
        return clone

    def stats(self) -> dict:
        return {"peagle": {"tree_nodes": self.shape.size, "depth": self.shape.max_depth, "draft_forwards": self._steps}}

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        shape, depth_of, rank_of, top = self._layout(max_depth)
        if shape.size == 1:
            return Tree(shape, torch.tensor([root]))
        scores = self.draft_scores(root, shape.max_depth)  # [depth, draft vocab]
        if self._params.draws_drafts:
            return drawn_block(root, scores, self._params, self._generator, self.vocab_ids, self.head.config.vocab_size)
        candidates = self.vocab_ids[scores.topk(top, dim=-1).indices]  # [depth, top] target ids
        drafted = candidates[depth_of, rank_of]
        root_t = torch.tensor([root]).to(drafted.device, non_blocking=True)
        return Tree(shape, torch.cat([root_t, drafted]))

    # -- one draft forward ---------------------------------------------------------------------------
    @torch.inference_mode()
    def draft_scores(self, root: int, depth: int) -> torch.Tensor:
        """Logits [depth, draft vocab] of draft positions 1..depth, from one forward over the newly
        committed positions (root last) and ``depth - 1`` mask slots."""
        head = self.head
        feats = torch.cat(self._pending).to(self.device)
        self._pending = []
        m, start = feats.shape[0], self._cached
        self._reserve(start + m)
        nxt = torch.tensor(self._ids[start + 1 :] + [root], device=self.device)
        g, attn_in = head.first_input(feats[None], nxt[None])
        if depth > 1:
            gm, attn_m = head.mask_input((1, depth - 1))
            g, attn_in = torch.cat([g, gm.to(g.dtype)], 1), torch.cat([attn_in, attn_m.to(attn_in.dtype)], 1)
        n = m + depth - 1
        positions = torch.arange(start, start + n, device=self.device)[None]
        mask = torch.ones(n, start + n, dtype=torch.bool, device=self.device)
        mask[:, start:] = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        state, _ = head.run_layers(g, attn_in, positions, mask[None], cache=self._cache, cache_length=start)
        self._cached = start + m  # the mask slots' rows are scratch
        self._steps += 1
        return head.logits(state[0, m - 1 :]).float()

    def _layout(self, max_depth: int) -> tuple[TreeShape, torch.Tensor, torch.Tensor, int]:
        """The (depth-truncated) shape, each drafted node's position and rank, the top-k needed."""
        if max_depth not in self._layouts:
            shape = self.shape.truncated(max_depth)
            depth_of = (shape.depth[1:] - 1).to(self.device)
            rank_of = torch.tensor(shape.ranks[1:], dtype=torch.long, device=self.device)
            self._layouts[max_depth] = (shape, depth_of, rank_of, max(shape.ranks[1:], default=0) + 1)
        return self._layouts[max_depth]

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` committed rows plus one step's mask slots, in preallocated buffers."""
        w = self.head.fc.weight
        self._cache = grown(self._cache, self._cached, rows + self.shape.max_depth,
                            lambda capacity: self.head.new_cache(capacity, w.device, w.dtype))


def measure_draft_seconds(head: torch.nn.Module, context: int = 64, repeats: int = 10) -> dict[int, float]:
    """Median seconds of one drafting step by depth d (one forward over the newly committed
    position and d - 1 mask slots, then its logits) after ``context`` committed positions. A tree
    of depth d costs this whatever its width: every node comes from the same forward."""
    param = head.fc.weight
    features = torch.randn(context, head.fc.in_features, device=param.device, dtype=param.dtype)
    ids = torch.zeros(context, dtype=torch.long)
    times = {0: 0.0}
    for depth in range(1, head.config.num_heads + 1):
        proposer = PEagleProposer(head, tree=[[0] * d for d in range(1, depth + 1)])
        proposer.start(ids, features, SamplingParams(), None)
        proposer.draft_scores(0, depth)  # feeds the context (later calls feed one position each)
        samples = []
        for _ in range(repeats):
            proposer.accepted(torch.zeros(1, dtype=torch.long), features[:1])
            t0 = time.perf_counter()
            proposer.draft_scores(0, depth)
            if param.device.type == "cuda":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        times[depth] = statistics.median(samples)
    return times


def depth_accuracy_table(
    target: torch.nn.Module, head: torch.nn.Module, sequences: list[torch.Tensor], max_rank: int = 10,
    skip_prompt: list[int] | None = None,
) -> torch.Tensor:
    """acc[d, r] = P(depth d+1's rank-r token == the token d+1 after the root) over the roots of
    ``sequences`` (the target's own greedy continuations: "correct" = what verification accepts),
    each step drafted exactly as decoding drafts it (the committed context before the root)."""
    depths = head.config.num_heads

    def ranked(proposer, token: int, ranks: int) -> torch.Tensor:
        scores = proposer.draft_scores(token, depths)
        return proposer.vocab_ids[scores.topk(min(ranks, scores.shape[-1]), dim=-1).indices]

    return rank_hit_table(target, head, sequences, lambda: PEagleProposer(head), ranked, max_rank, skip_prompt,
                          host_tokens=True)
