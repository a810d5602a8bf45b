"""EAGLE-2 proposer: a dynamic draft tree grown by the EAGLE draft layer, pruned to a token budget.

Each step:
1. catch up: run the draft layer over the positions committed since the last step (their real
   target features and the tokens after them, the new root last), appending to the draft's KV
   cache. Its output at the root gives the root's children's log-probabilities.
2. expand, depth by depth: the ``top_k`` best nodes so far at the current depth (by joint draft
   log-probability, the sum along the path) go through the draft layer together, each attending
   to the committed cache and its own ancestors; each proposes its ``top_k`` best children.
3. rerank: keep the ``total_tokens - 1`` best nodes of everything created. A child's joint
   probability never exceeds its parent's, so the kept set is a connected tree.
The tree's KV entries are dropped after each step; only committed positions stay cached. Drafts
are deterministic top-k picks (point masses for the verifier), so sampling stays exact; when the
request samples with drawn drafts (`SamplingParams.draws_drafts`), a chain is drawn instead
(`eagle_tree.draw_chain`).
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree import Tree, chain_shape
from .base import Proposer
from .draft_cache import grown
from .eagle_rows import EagleRows
from .row_base import RowProposer
from .eagle_tree import draw_chain, grow, select
from .sampled import chains

# Small enough to pay off on a CPU, where verify cost grows quickly with tree size; `draftheads
# calibrate` measures better values for the device.
DEFAULT_TOTAL_TOKENS = 12
DEFAULT_DEPTH = 5
DEFAULT_TOP_K = 4


def eagle_proposer(head: torch.nn.Module, tree: dict | None = None) -> "EagleProposer":
    """EAGLE-2's dynamic tree for ``head`` (settings: ``tree`` dict, else the calibrated ones, else defaults)."""
    settings = tree if tree is not None else (head.tree or {})
    if not isinstance(settings, dict):
        raise ValueError(
            f"{head.head_type} heads draft a dynamic tree: pass tree={{'total_tokens': .., 'depth': .., 'top_k': ..}}, "
            "not a static list of paths"
        )
    return EagleProposer(head, **settings)


class EagleProposer(Proposer):
    def __init__(
        self,
        head: torch.nn.Module,
        total_tokens: int = DEFAULT_TOTAL_TOKENS,
        depth: int = DEFAULT_DEPTH,
        top_k: int = DEFAULT_TOP_K,
        draft_vocab_size: int | None = None,
    ) -> None:
        settings = (("total_tokens", total_tokens), ("depth", depth), ("top_k", top_k))
        if draft_vocab_size is not None:
            settings += (("draft_vocab_size", draft_vocab_size),)
        for name, value in settings:
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EAGLE tree setting {name} must be a positive integer, got {value!r}")
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
        self._cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._cached = 0  # draft-cache rows: positions whose (feature, next token) were fed

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def start(self, input_ids, hidden, params: SamplingParams, generator) -> None:
        self._ids = input_ids.tolist()
        self._pending = [hidden]  # target features of committed positions not yet fed to the draft
        self._cached = 0
        self._ensure_capacity(input_ids.numel() + 256)
        self._params, self._generator = params, generator

    def fork(self) -> "EagleProposer":
        """Its own draft KV buffers (`start` reuses them when large enough)."""
        clone = super().fork()
        clone._cache, clone._cached = None, 0
        return clone

    def accepted(self, tokens, hidden) -> None:
        self._ids.extend(tokens.tolist())
        self._pending.append(hidden)

    def rows(self, compaction: str = "auto") -> RowProposer:
        """Every row drafted with one draft-layer forward per depth over a shared draft cache."""
        return EagleRows(self, compaction=compaction)

    def stats(self) -> dict:
        return {"eagle_tree": {"total_tokens": self.total_tokens, "depth": self.depth, "top_k": self.top_k,
                               "draft_vocab_size": self.draft_vocab_size}}

    def _ensure_capacity(self, rows: int) -> None:
        """Room for ``rows`` committed rows plus one step's tree, in preallocated buffers."""
        w = self.head.fc.weight
        self._cache = grown(self._cache, self._cached, rows + self.top_k * self.depth + 1,
                            lambda capacity: self.head.new_cache(capacity, w.device, w.dtype))

    # -- one step ---------------------------------------------------------------------------------
    def _catch_up(self, root: int) -> torch.Tensor:
        """Feed the newly committed positions; return the draft state at the last one [d]."""
        feats = torch.cat(self._pending).to(self.device)
        self._pending = []
        m, start = feats.shape[0], self._cached
        self._ensure_capacity(start + m)
        nxt = torch.tensor(self._ids[start + 1 :] + [root], device=self.device)
        g, attn_in = self.head.first_input(feats[None], nxt[None])
        positions = torch.arange(start, start + m, device=self.device)[None]
        mask = torch.ones(m, start + m, dtype=torch.bool, device=self.device)
        mask[:, start:] = torch.ones(m, m, dtype=torch.bool, device=self.device).tril()
        state, _ = self.head.run_layers(g, attn_in, positions, mask[None], cache=self._cache, cache_length=start)
        self._cached = start + m
        return state[0, -1]

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        depth = min(self.depth, max_depth)
        if depth < 1 or self.total_tokens == 1:  # nothing to draft (total_tokens=1 = plain decoding)
            return Tree(chain_shape(0), torch.tensor([root]))
        root_state = self._catch_up(root)
        prefix = self._cached
        visible = torch.ones(1, prefix, dtype=torch.bool, device=self.device)
        first_pos = torch.full((1,), prefix, dtype=torch.long, device=self.device)
        if self._params.draws_drafts:  # a drawn chain (`sampled`) as deep as the tree, within its token budget
            depth = min(depth, self.total_tokens - 1)
            drafts, laws = draw_chain(self.head, self._logits, self._vocab_ids_dev, self._cache, visible, first_pos,
                                      root_state[None], depth, self._params, self._generator)
            return chains([root], drafts, laws, [depth])[0]
        tokens, parents, scores = grow(self.head, self._logits, self._vocab_ids_dev, self._cache, visible, first_pos,
                                       root_state[None], depth, self.top_k)
        return select([root], tokens, parents, scores, [tokens.shape[1]], self.total_tokens, self._vocab_ids_dev)[0]
