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
are deterministic top-k picks (point masses for the verifier), so sampling stays exact.
"""
from __future__ import annotations

import torch

from ..sampling import SamplingParams
from ..tree import Tree, TreeShape
from .base import Proposer

# Small enough to pay off on a CPU, where verify cost grows quickly with tree size; `draftheads
# calibrate` measures better values for the device.
DEFAULT_TOTAL_TOKENS = 12
DEFAULT_DEPTH = 5
DEFAULT_TOP_K = 4


class EagleProposer(Proposer):
    def __init__(
        self,
        head: torch.nn.Module,
        total_tokens: int = DEFAULT_TOTAL_TOKENS,
        depth: int = DEFAULT_DEPTH,
        top_k: int = DEFAULT_TOP_K,
    ) -> None:
        for name, value in (("total_tokens", total_tokens), ("depth", depth), ("top_k", top_k)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"EAGLE tree setting {name} must be a positive integer, got {value!r}")
        self.head = head.eval()
        self.total_tokens, self.depth, self.top_k = total_tokens, depth, top_k
        self.feature_layers = head.feature_layers  # the verifier returns these features
        if hasattr(head, "check_vocab_mapping"):
            head.check_vocab_mapping()
        ids = head.vocab_ids()
        self.vocab_ids = None if ids is None else ids.cpu()  # draft index -> target id (EAGLE-3)
        self._vocab_ids_dev = None if ids is None else ids.to(self.device)
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._cached = 0  # draft-cache rows: positions whose (feature, next token) were fed

    @property
    def device(self) -> torch.device:
        return self.head.fc.weight.device

    def start(self, input_ids, hidden, params: SamplingParams, generator) -> None:
        self._ids = input_ids.tolist()
        self._pending = [hidden]  # target features of committed positions not yet fed to the draft
        self._kv, self._cached = None, 0

    def accepted(self, tokens, hidden) -> None:
        self._ids.extend(tokens.tolist())
        self._pending.append(hidden)

    def stats(self) -> dict:
        return {"eagle_tree": {"total_tokens": self.total_tokens, "depth": self.depth, "top_k": self.top_k}}

    # -- one step ---------------------------------------------------------------------------------
    def _catch_up(self, root: int) -> torch.Tensor:
        """Feed the newly committed positions; return the draft state at the last one [d]."""
        feats = torch.cat(self._pending).to(self.device)
        self._pending = []
        m, start = feats.shape[0], self._cached
        nxt = torch.tensor(self._ids[start + 1 :] + [root], device=self.device)
        g, attn_in = self.head.first_input(feats[None], nxt[None])
        positions = torch.arange(start, start + m, device=self.device)[None]
        mask = torch.ones(1, m, start + m, dtype=torch.bool, device=self.device)
        mask[0, :, start:] = torch.ones(m, m, dtype=torch.bool, device=self.device).tril()
        state, new_kv = self.head.run_layers(g, attn_in, positions, mask, self._kv)
        self._kv = new_kv if self._kv is None else [
            (torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(self._kv, new_kv)
        ]
        self._cached = start + m
        return state[0, -1]

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        depth = min(self.depth, max_depth)
        if depth < 1:
            return Tree(TreeShape((-1,)), torch.tensor([root]))
        head, k, dev = self.head, self.top_k, self.device
        root_state = self._catch_up(root)
        prefix = self._cached

        logp = head.logits(root_state[None]).float().log_softmax(-1)[0]
        top = logp.topk(k)
        # Every created node (root excluded): draft-vocab token, parent (0 = root), joint log-prob.
        tokens, parents, scores = [top.indices], [torch.zeros(k, dtype=torch.long)], [top.values]
        frontier = torch.arange(1, k + 1)  # node ids (root = 0) of the nodes to expand next
        frontier_states = root_state[None].expand(k, -1)  # their parents' draft states
        frontier_tokens = top.indices
        tree_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        anc = torch.zeros(0, 0, dtype=torch.bool, device=dev)  # ancestor mask among expanded nodes
        expanded_row: dict[int, int] = {}  # node id -> row in tree_kv
        created = k
        for level in range(1, depth):
            n = frontier.numel()
            # Each frontier node sees its expanded ancestors (its parent's row, and theirs) and itself.
            parent_rows = [expanded_row.get(int(p)) for p in self._parents_of(parents, frontier)]
            rows = torch.zeros(n, anc.shape[0] + n, dtype=torch.bool, device=dev)
            for i, r in enumerate(parent_rows):
                if r is not None:
                    rows[i, : anc.shape[0]] = anc[r]
                rows[i, anc.shape[0] + i] = True
            mask = torch.cat([torch.ones(n, prefix, dtype=torch.bool, device=dev), rows], dim=1)[None]
            past = self._kv if tree_kv is None else [
                (torch.cat([ck, tk], 2), torch.cat([cv, tv], 2)) for (ck, cv), (tk, tv) in zip(self._kv, tree_kv)
            ]
            fed = frontier_tokens.to(dev)
            if self._vocab_ids_dev is not None:
                fed = self._vocab_ids_dev[fed]  # the embedding takes target ids
            g, attn_in = head.next_input(frontier_states[None], fed[None])
            positions = torch.full((1, n), prefix + level - 1, device=dev)
            out, new_kv = head.run_layers(g, attn_in, positions, mask, past)
            tree_kv = new_kv if tree_kv is None else [
                (torch.cat([tk, k_], 2), torch.cat([tv, v_], 2)) for (tk, tv), (k_, v_) in zip(tree_kv, new_kv)
            ]
            new_anc = torch.zeros(anc.shape[0] + n, anc.shape[0] + n, dtype=torch.bool, device=dev)
            new_anc[: anc.shape[0], : anc.shape[0]] = anc
            new_anc[anc.shape[0] :] = rows
            for i, node in enumerate(frontier.tolist()):
                expanded_row[node] = anc.shape[0] + i
            anc = new_anc

            child_logp = head.logits(out[0]).float().log_softmax(-1)  # [n, V]
            best = child_logp.topk(k, dim=-1)
            parent_scores = torch.cat(scores)[frontier - 1]
            cand_scores = (parent_scores[:, None] + best.values).reshape(-1)
            cand_tokens = best.indices.reshape(-1)
            cand_parents = frontier.repeat_interleave(k)
            tokens.append(cand_tokens)
            parents.append(cand_parents)
            scores.append(cand_scores)
            keep = cand_scores.topk(k).indices
            frontier = created + 1 + keep
            frontier_states = out[0].repeat_interleave(k, dim=0)[keep]
            frontier_tokens = cand_tokens[keep]
            created += cand_scores.numel()

        return self._select(root, torch.cat(tokens), torch.cat(parents), torch.cat(scores))

    @staticmethod
    def _parents_of(parents: list[torch.Tensor], nodes: torch.Tensor) -> list[int]:
        flat = torch.cat(parents)
        return flat[nodes - 1].tolist()

    def _select(self, root: int, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor) -> Tree:
        """The best ``total_tokens - 1`` nodes, re-indexed into a tree (creation order keeps parents first)."""
        budget = min(self.total_tokens - 1, scores.numel())
        # Stable descending sort: on equal scores the earlier-created node (a parent) wins.
        order = torch.sort(-scores, stable=True).indices[:budget]
        keep = order.sort().values  # creation order
        new_id = {0: 0}
        new_parents = [-1]
        for j, node in enumerate((keep + 1).tolist(), start=1):
            new_id[node] = j
            new_parents.append(new_id[int(parents[node - 1])])
        drafted = tokens[keep].cpu()
        if self.vocab_ids is not None:
            drafted = self.vocab_ids[drafted]
        return Tree(TreeShape(tuple(new_parents)), torch.cat([torch.tensor([root]), drafted]))
