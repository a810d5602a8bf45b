"""Medusa drafting: each head's top-k, from one hidden state per row, fills a static tree shape.

The hidden state is the target's at the row's last position in its cache, which the verify
forward already computed: drafting costs K small MLPs and K vocab projections on ONE position per
row, for every row at once, never an extra target forward. The only per-row state is that hidden
state.
"""
from __future__ import annotations

import torch

from ...plans import StaticTree
from ...inference.sampling import SamplingParams
from ...inference.tree import Tree, TreeShape, default_choices, static_shape
from ...inference.proposers.drafter import Drafter
from ...inference.proposers.sampled import chains, draw


class MedusaDrafter(Drafter):
    """Medusa heads drafting all rows at once from each row's last hidden state.

    ``tree``: rank paths (None: the default tree for their number of heads).
    ``draft_vocab_size``: project the heads onto only the N most frequent training tokens
    (None: the whole vocabulary). Drafting
    gets N/V times cheaper; tokens outside that set are never drafted, which costs acceptance
    but never correctness (the verifier decides every token)."""

    def __init__(
        self,
        heads: torch.nn.Module,
        tree: StaticTree | list[list[int]] | TreeShape | None = None,
        draft_vocab_size: int | None = None,
    ) -> None:
        self.heads = heads.eval()
        self._a_parameter = next(heads.parameters())
        if tree is None:
            tree = default_choices(heads.config.num_heads)
        self.shape = static_shape(tree, f"{heads.head_type} heads")
        if self.shape.max_depth > heads.config.num_heads:
            raise ValueError(
                f"the tree is {self.shape.max_depth} deep but the heads have only {heads.config.num_heads} "
                "heads (one per depth): use a shallower tree or heads trained with more heads"
            )
        self.vocab_ids = heads.draft_vocab(draft_vocab_size)
        if self.vocab_ids is not None:
            self.vocab_ids = self.vocab_ids.to(self.heads_device)
        drafted = heads.config.vocab_size if self.vocab_ids is None else self.vocab_ids.numel()
        rank = max(self.shape.ranks[1:], default=-1)
        if rank >= drafted:  # topk would fail in the first decode step
            raise ValueError(
                f"the tree takes rank {rank}, but the heads draft from {drafted} tokens "
                f"({'the whole vocabulary' if self.vocab_ids is None else 'draft_vocab_size'}): ranks are 0..{drafted - 1}"
            )
        self._projections = [self._projection(k) for k in range(heads.config.num_heads)]
        self._last: torch.Tensor | None = None  # [rows, H]
        self._index_cache: dict[int, tuple[TreeShape, torch.Tensor, torch.Tensor, int, int]] = {}

    def _layout(self, max_depth: int) -> tuple[TreeShape, torch.Tensor, torch.Tensor, int, int]:
        """For a (possibly depth-truncated) shape: which head and rank fill each non-root node, the
        top-k needed and the heads used (host ints, so a step reads nothing back from the device)."""
        if max_depth not in self._index_cache:
            shape = self.shape.truncated(max_depth)
            head = (shape.depth[1:] - 1).to(self.heads_device)
            rank = torch.tensor(shape.ranks[1:], dtype=torch.long, device=self.heads_device)
            top = max(shape.ranks[1:], default=0) + 1
            used = shape.max_depth
            self._index_cache[max_depth] = (shape, head, rank, top, used)
        return self._index_cache[max_depth]

    @torch.no_grad()
    def _projection(self, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        weight, bias = self.heads.projection_weight(k)
        if self.vocab_ids is None:
            return weight, bias
        ids = self.vocab_ids.to(weight.device)
        return weight[ids].contiguous(), None if bias is None else bias[ids].contiguous()

    @property
    def heads_device(self) -> torch.device:
        # One parameter held, not `next(heads.parameters())` per call: that walks the module tree,
        # several times per step. `Module.to` moves a parameter's data in place, so it follows.
        return self._a_parameter.device

    def start(self, prompts, hidden, params: SamplingParams, generator) -> None:
        self._last = torch.stack([h[-1] for h in hidden])
        self._params, self._generator = params, generator

    def propose(self, roots: list[int], max_depths: list[int]) -> list[Tree]:
        if self._params.draws_drafts:
            return self.draw_chains(roots, self._last, max_depths, self._params, self._generator)
        shape, tokens = self.draft_rows(torch.tensor(roots), self._last, max(max_depths))
        return [truncate(Tree(shape, tokens[r]), d) for r, d in enumerate(max_depths)]

    def accepted(self, tokens, hidden) -> None:
        self._last = hidden[0][-1:] if len(hidden) == 1 else torch.stack([h[-1] for h in hidden])

    def keep(self, rows: list[int]) -> None:
        self._last = self._last[rows]

    @torch.no_grad()
    def draft_rows(self, roots: torch.Tensor, hidden: torch.Tensor, max_depth: int) -> tuple[TreeShape, torch.Tensor]:
        """The static tree for a batch of rows: ``roots`` [B], ``hidden`` [B, H] (each row's
        last committed hidden state) -> the shape and its tokens [B, n], every row one tree."""
        shape, head, rank, top, used = self._layout(max_depth)
        roots = roots.reshape(-1, 1).cpu()
        if shape.size == 1:
            return shape, roots
        states = self.heads.head_states(hidden.to(self.heads_device))
        logits = torch.stack([
            torch.nn.functional.linear(states[k].to(weight.dtype), weight, bias)
            for k, (weight, bias) in enumerate(self._projections[:used])
        ])  # [used, B, V or draft vocab]
        candidates = logits.topk(top, dim=-1).indices  # [used, B, top]
        if self.vocab_ids is not None:
            candidates = self.vocab_ids[candidates]
        drafted = candidates[head, :, rank].T  # [B, n - 1]
        # Tokens stay on the device (the batched verify reads them there): no copy to the host.
        return shape, torch.cat([roots.to(drafted.device, non_blocking=True), drafted], dim=1)

    @torch.no_grad()
    def draw_chains(self, roots: list[int], hidden: torch.Tensor, max_depths: list[int], params: SamplingParams,
                    generator: torch.Generator | None) -> list[Tree]:
        """Per row a chain as deep as the tree (at most its ``max_depths``), each depth DRAWN from
        its head's processed distribution (`sampled`): head k's law does not depend on the drafts
        before it, so every depth is drawn from the one hidden state."""
        depths = [min(d, self.shape.max_depth) for d in max_depths]
        states = self.heads.head_states(hidden.to(self.heads_device)) if max(depths) else None
        drafts, laws = [], []
        for k in range(max(depths)):
            weight, bias = self._projections[k]
            tokens, law = draw(torch.nn.functional.linear(states[k].to(weight.dtype), weight, bias), params, generator,
                               self.vocab_ids, self.heads.config.vocab_size)
            drafts.append(tokens)
            laws.append(law)
        return chains(roots, drafts, laws, depths)


def truncate(tree: Tree, max_depth: int) -> Tree:
    """``tree`` without nodes deeper than ``max_depth``: a row near max_new_tokens in a batch drafted
    deeper. Exact for heads whose nodes depend only on their ancestors (Medusa, Hydra)."""
    if max_depth >= tree.shape.max_depth:
        return tree
    keep = tree.shape.depth <= max_depth
    return Tree(tree.shape.truncated(max_depth), tree.tokens[keep])
