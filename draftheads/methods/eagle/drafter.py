"""EAGLE-2 drafting: a dynamic draft tree grown by the EAGLE draft layer, pruned to a token budget,
for every row of a batch at once (one draft-layer forward per depth for all rows).

Each step:
1. catch up: run the draft layer over the positions committed since the last step (their real
   target features and the tokens after them, the new root last), appending to the draft's KV
   cache. Its output at the root gives the root's children's log-probabilities.
2. expand, depth by depth: the ``top_k`` best nodes so far at the current depth (by joint draft
   log-probability, the sum along the path) go through the draft layer together, each attending
   to the committed cache and its own ancestors; each proposes its ``top_k`` best children.
3. rerank: keep the ``total_tokens - 1`` best nodes of everything created. A child's joint
   probability never exceeds its parent's, so the kept set is a connected tree. Heads that keep a
   confidence table (``confidence.json``, `heads.confidence`) rank by the measured chance of
   acceptance instead of the draft probability, in steps 2 and 3 alike, when decoding greedily.
The tree's KV entries are dropped after each step; only committed positions stay cached. Drafts
are deterministic top-k picks (point masses for the verifier), so sampling stays exact; when the
request samples with drawn drafts (`SamplingParams.draws_drafts`), siblings are drawn instead,
without replacement, in a shape fitted to their measured acceptance (`drawn_trees`,
`tree_search.draw_tree`; top_k 1: a drawn chain, `tree_search.draw_chain`).

Rows share one draft KV cache [rows, kv, slots, hd], because drafting row by row would run
rows x depths small forwards per step, where kernel launches, not FLOPs, set the cost:
- catch-up: each row feeds the positions committed since its last step (a different number per
  row: accepted counts differ, prompts differ at the first step), padded to the longest; the
  padding slots become holes that the row's mask hides (``visible`` [rows, slots]). Positions are
  per row (each row's own committed count), so holes never shift RoPE.
- expansion: `eagle_tree.grow` with every row's visibility mask; each row gets the tree it would
  get drafted alone (a batch of one: same code, only the cache layout differs).
- holes are removed (one gather of the draft cache, each row's entries then contiguous from slot
  0: right-padded with per-row lengths) when rows leave the batch, and by the ``compaction``
  policy (`inference.compaction`, the decoder's ``compaction``).
"""
from __future__ import annotations

import torch

from ...plans import DynamicTree
from ...plans.trees import DEFAULT_DEPTH, DEFAULT_TOP_K, DEFAULT_TOTAL_TOKENS
from ...inference.compaction import check_compaction, wants_compaction
from ...inference.tree import Tree, chain_shape
from ...inference.proposers.draft_cache import grown
from .tree_search import draw_chain, draw_tree, grow, nodes_up_to, select
from ...inference.proposers.drawn_trees import SiblingAcceptance, drawn_tree_tokens, fitted_shape
from ...inference.proposers.feed import FeedRows
from ...inference.proposers.sampled import chains


def eagle_drafter(head: torch.nn.Module, tree: DynamicTree | dict | None = None) -> "EagleDrafter":
    """EAGLE-2's dynamic tree for ``head``: ``tree`` (settings, missing ones the defaults), else
    the defaults (`plans.DynamicTree`)."""
    spec = DynamicTree.parse(tree if tree is not None else {}, f"{head.head_type} heads")
    return EagleDrafter(head, spec.total_tokens, spec.depth, spec.top_k, spec.draft_vocab_size)


class EagleDrafter(FeedRows):
    """EAGLE / EAGLE-3 heads drafting EAGLE-2 trees (module docstring). ``draft_vocab_size``:
    rank only the N most frequent training tokens (EAGLE, whose head scores with the target's LM
    head); ``compaction``: when the draft cache's holes are removed (the decoder hands its own,
    `use_compaction`)."""

    def __init__(
        self,
        head: torch.nn.Module,
        total_tokens: int = DEFAULT_TOTAL_TOKENS,
        depth: int = DEFAULT_DEPTH,
        top_k: int = DEFAULT_TOP_K,
        draft_vocab_size: int | None = None,
        compaction: str = "auto",
    ) -> None:
        # the settings' one check (positive whole numbers), whether built from tree.json or by hand
        DynamicTree.parse({"total_tokens": total_tokens, "depth": depth, "top_k": top_k,
                           "draft_vocab_size": draft_vocab_size}, f"{head.head_type} heads")
        self.head = head.eval()
        self.total_tokens, self.depth, self.top_k = total_tokens, depth, top_k
        # EAGLE reads the last hidden state; EAGLE-3 the inputs of its fused layers.
        self.feature_layers = tuple(head.feature_layers) if head.feature_layers else (-1,)
        if hasattr(head, "check_vocab_mapping"):
            head.check_vocab_mapping()
        ids = head.vocab_ids()
        self._logits = head.logits
        self.draft_vocab_size = draft_vocab_size
        if ids is None and draft_vocab_size is not None:
            # EAGLE scores with the target's whole LM head; ranking only the most frequent training
            # tokens makes each level's projection V/N times cheaper (on a small target it is the
            # largest part of drafting). Rarer tokens are never drafted; the verifier decides.
            ids = head.draft_vocab(draft_vocab_size)
            if ids is not None:
                full = head.target_lm_head().weight
                weight = full[ids.to(full.device)].detach()
                self._logits = lambda state: torch.nn.functional.linear(state.to(weight.dtype), weight)
        self.vocab_ids = None if ids is None else ids.cpu()  # draft index -> target id
        drafted = head.config.vocab_size if ids is None else ids.numel()
        if top_k > drafted:  # topk would fail in the first decode step
            raise ValueError(f"EAGLE tree setting top_k {top_k} exceeds the {drafted} tokens the head drafts from")
        self._vocab_ids_dev = None if ids is None else ids.to(self.device)
        self.use_compaction(compaction)
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.compactions = 0
        self.max_excess = 0
        self._siblings = SiblingAcceptance(top_k)
        self._drawn: list[Tree] | None = None

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    @property
    def _rescore(self):
        """How nodes are ranked: greedy, by the heads' measured chance of acceptance when they keep
        a confidence table (`heads.confidence`), else by joint draft probability (EAGLE-2). The
        table holds greedy hits; sampled, a candidate is accepted with the target's tempered
        probability of it, which the table does not measure (ranked by it, top-k trees accepted
        less at T = 1 on two small hybrids: docs/results.md), so sampled trees keep EAGLE-2's rank."""
        table = getattr(self.head, "confidence", None)
        return None if table is None or not self._params.greedy else table.rescore

    def use_compaction(self, policy: str) -> None:
        self.compaction = check_compaction(policy, "EAGLE draft-cache compaction")

    def start(self, prompts, hidden, params, generator) -> None:
        self.start_feed(prompts, hidden)
        # Committed draft-cache positions per row: host ints, also each row's visible slots (holes excluded).
        self._lengths = [0] * len(prompts)
        # [rows, slots] on the host: the layout is host bookkeeping (no device reads to plan a step)
        self._visible = torch.zeros(len(prompts), 0, dtype=torch.bool)
        self._cache = None
        self.compactions = 0
        self.max_excess = 0
        self._reserve(max(len(ids) for ids in self._ids) + 256)
        self._params, self._generator = params, generator
        self._drawn: list[Tree] | None = None  # the last step's drawn trees, until `accepted` counts them
        # Sibling acceptance is learned per generation: carried over, the shapes (so the draws) of a seeded
        # request would depend on the requests before it, and the same seed would sample other tokens.
        self._siblings = SiblingAcceptance(self.top_k)

    def keep(self, rows: list[int]) -> None:
        """Drop the rows that left; the same copy of the draft cache removes the holes."""
        self.keep_feed(rows)
        self._lengths = [self._lengths[r] for r in rows]
        self._gather(torch.tensor(rows, dtype=torch.long))

    def stats(self) -> dict:
        return {"eagle_tree": {"total_tokens": self.total_tokens, "depth": self.depth, "top_k": self.top_k,
                               "draft_vocab_size": self.draft_vocab_size},
                "draft_cache": {"compaction": self.compaction, "compactions": self.compactions,
                                "max_excess_slots": self.max_excess},
                **({"drawn_sibling_acceptance": [round(c, 3) for c in self._siblings.rates]}
                   if self._siblings.measured else {})}

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
        theirs pending, as they would drafted alone); return the draft state at each row's root [rows, d]."""
        dev, rows = self.device, len(roots)
        feats, counts = self.take_pending(drafting, dev)  # padded to the longest (a row's padding: holes)
        if any(d and not c for d, c in zip(drafting, counts)):
            raise RuntimeError("EAGLE drafting again before `accepted`: a row has no new position to feed")
        m, prefix = max(counts), self._visible.shape[1]
        self._reserve(prefix + m + self.top_k * self.depth + 1)
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
        depths = [0 if self.total_tokens == 1 else min(self.depth, d) for d in max_depths]
        drafting = [d >= 1 for d in depths]
        if not any(drafting):  # nothing to draft (total_tokens=1 = plain decoding)
            return [Tree(chain_shape(0), torch.tensor([root])) for root in roots]
        visible, first_pos, root_states = self._prepare(roots, drafting)
        if self._params.draws_drafts and self.top_k > 1:  # a drawn tree (`drawn_trees`)
            return self._drawn_trees(roots, depths, visible, first_pos, root_states)
        if self._params.draws_drafts:  # a drawn chain (`sampled`) as deep as the tree, within its token budget
            depths = [min(d, self.total_tokens - 1) for d in depths]
            drafts, laws = draw_chain(self.head, self._logits, self._vocab_ids_dev, self._cache, visible, first_pos,
                                      root_states, max(depths), self._params, self._generator)
            return chains(roots, drafts, laws, depths)
        tokens, parents, scores = grow(self.head, self._logits, self._vocab_ids_dev, self._cache, visible, first_pos,
                                       root_states, max(depths), self.top_k, self._rescore)
        # A row drafting shallower keeps only its first levels' nodes (what it grows drafted alone).
        nodes = [nodes_up_to(max(d, 1), self.top_k) for d in depths]
        trees = select(roots, tokens, parents, scores, nodes, self.total_tokens, self._vocab_ids_dev)
        return [tree if d >= 1 else Tree(chain_shape(0), torch.tensor([root])) for tree, d, root in zip(trees, depths, roots)]

    def _drawn_trees(self, roots: list[int], depths: list[int], visible: torch.Tensor, first_pos: torch.Tensor,
                     root_states: torch.Tensor) -> list[Tree]:
        """Every row's tree of drawn siblings in the shape fitted to this generation's sibling
        acceptance so far (`drawn_trees`), cut at each row's depth; the trees are kept for `accepted`.
        It verifies as many tokens as the drawn chain as deep as the tree would (`drawn_tree_tokens`):
        what the benchmarks compare, trees against chains of equal verify tokens."""
        shape = fitted_shape(self._siblings.rates, drawn_tree_tokens(self.total_tokens, self.depth), max(depths),
                             self.top_k)
        internal = sum(1 for kids in shape.children if kids)
        self._reserve(self._visible.shape[1] + internal + 1)
        tokens, laws = draw_tree(self.head, self._logits, self._vocab_ids_dev, self._cache, visible, first_pos,
                                 root_states, shape, self._params, self._generator, self.head.config.vocab_size)
        tokens[:, 0] = torch.tensor(roots).to(tokens.device, non_blocking=True)
        trees = []
        for r, d in enumerate(depths):
            tree = Tree(shape, tokens[r], laws[r]) if d >= 1 else Tree(chain_shape(0), torch.tensor([roots[r]]))
            trees.append(tree.truncated(d) if d >= 1 else tree)
        self._drawn = trees
        return trees

    def accepted(self, tokens, hidden) -> None:
        super().accepted(tokens, hidden)
        if self._drawn is not None:
            for tree, path in zip(self._drawn, tokens):
                self._siblings.record(tree, path.tolist())
            self._drawn = None

    @torch.inference_mode()
    def scored_nodes(self, root: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every node one row's step grows from ``root``, ``depth`` levels of ``top_k``, with its
        joint draft log-probability (never rescored), as the target's ids: (tokens, parent node ids,
        log-probabilities), each [nodes] in creation order (`tree_search.grow`). What the confidence
        table is measured from (`confidence.measure_confidence`); `accepted` follows as after `propose`."""
        visible, first_pos, root_states = self._prepare([root], [True])
        tokens, parents, scores = grow(self.head, self._logits, self._vocab_ids_dev, self._cache, visible, first_pos,
                                       root_states, self.depth, self.top_k)
        ids = tokens[0] if self._vocab_ids_dev is None else self._vocab_ids_dev[tokens[0]]
        return ids.cpu(), parents[0].cpu(), scores[0].cpu()

    def _prepare(self, roots: list[int], drafting: list[bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Catch the drafting rows up (compacting the draft cache when its policy says so): each
        row's visible slots, first drafted position and draft state at its root, on the device."""
        root_states = self._catch_up(roots, drafting)
        excess = self._excess()
        self.max_excess = max(self.max_excess, excess)
        if wants_compaction(self.compaction, excess, self._visible.shape[1]):
            self._gather()
        visible = self._visible.to(self.device, non_blocking=True)
        first_pos = torch.tensor(self._lengths).to(self.device, non_blocking=True)
        return visible, first_pos, root_states
