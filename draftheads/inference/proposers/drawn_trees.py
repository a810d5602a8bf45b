"""Drawn trees: when a request samples, siblings DRAWN without replacement from the head's law, in a
shape fitted to how often each sibling is accepted.

Why: a drawn chain's draft is accepted with probability 1 - TV(p, q) (`sampled`). When that is near
a half, as on small heads at T = 1, the deep end of a chain earns little (the fifth draft is reached
one step in thirty), while a second sibling, drawn from q without the first one's token, gets a
fresh chance at the target's leftover mass each time the first is rejected.

Exact: child j of a node is drawn from q_j, the parent's processed draft law with its earlier
siblings' tokens removed and renormalised, and q_j is what the verifier is told (row j of
`Tree.draft_probs`). `accept.accept_sampling` tries siblings in order, accepting with
min(1, r/q_j) and otherwise moving to r <- norm(max(r - q_j, 0)); a rejected sibling x had
r(x) < q_j(x), so r has no mass left on it, and each stage is the one-draft rule applied to the
draft's conditional law: the output is the target's law (recursive rejection sampling without
replacement, Jeon et al. 2024, "Recursive Speculative Decoding"). A sibling whose law has no mass
left (top-k / top-p leave fewer tokens than siblings) becomes a point mass on the sibling before it,
which the verifier then rejects with certainty: still exact, and the shape needs no host read.

The shape is fixed before a step draws, from earlier steps' acceptances only, and no drawn node is
ever dropped: keeping the best of many draws (EAGLE-2's rerank) would make a draft's presence
depend on its own value, and its law would no longer be q_j. `SiblingAcceptance` counts, per
sibling rank j, how often the verifier accepted the j-th sibling when it tried it (the earlier
ones rejected): c_j. A node's chance of acceptance is then the product along its path of
P(rank accepted | parent reached) = (1 - c_1) ... (1 - c_{j-1}) c_j, and `fitted_shape` grows the
tree best-first by that chance within a token budget, depth and top-k (a chain when c_1 is high,
bushier as it falls; Sequoia's positional model, learned online). EAGLE's drafter gives it the
verify tokens of the drawn chain it replaces (`drawn_tree_tokens`), so a step costs what it cost
before and only the shape changes.
"""
from __future__ import annotations

import heapq
from functools import lru_cache
from typing import Sequence

import torch

from ..sampling import sample_rows
from ..tree import Tree, TreeShape

#: Pseudo-counts every rank starts from (a half, worth two tries): enough to draw a sensible first
#: tree, few enough that a few steps of the generation's own acceptances outweigh them.
PRIOR_HITS, PRIOR_TRIES = 1.0, 2.0


class SiblingAcceptance:
    """c_j per sibling rank, from the drawn trees a drafter verified (module docstring). One per
    generation, so that the shapes, and with them the draws, follow from the request and its seed
    alone (learned across requests, the same seed would draw other tokens)."""

    def __init__(self, top_k: int) -> None:
        self.hits = [PRIOR_HITS] * top_k
        self.tries = [PRIOR_TRIES] * top_k
        self.measured = False  # whether any drawn tree was recorded (the prior alone otherwise)

    @property
    def rates(self) -> list[float]:
        return [h / t for h, t in zip(self.hits, self.tries)]

    def record(self, tree: Tree, accepted: Sequence[int]) -> None:
        """What the verifier did with ``tree``: ``accepted`` is the root and the accepted drafts
        (tokens). Down the accepted path, each node's siblings were tried in order up to the
        accepted one; at the path's end every child was tried and rejected. Point-mass siblings
        (a law with no mass left: the token of a sibling before them) were never a real try."""
        tokens = tree.tokens.tolist()
        children = tree.shape.children
        self.measured = True
        node, depth = 0, 1
        while True:
            nxt = accepted[depth] if depth < len(accepted) else None
            seen: set[int] = set()
            found = None
            for rank, child in enumerate(children[node]):
                if tokens[child] in seen or rank >= len(self.hits):
                    break
                seen.add(tokens[child])
                self.tries[rank] += 1
                if tokens[child] == nxt:
                    self.hits[rank] += 1
                    found = child
                    break
            if found is None:
                return
            node, depth = found, depth + 1


def drawn_tree_tokens(total_tokens: int, depth: int) -> int:
    """How many tokens a drawn tree of these settings verifies, root included: as many as the drawn
    chain as deep as the tree (depth + 1), at most ``total_tokens``. A plan timed with drawn chains
    then costs the same per step; only the shape changes."""
    return min(total_tokens, depth + 1)


def fitted_shape(rates: Sequence[float], total_tokens: int, depth: int, top_k: int) -> TreeShape:
    """The tree of at most ``total_tokens`` nodes (root included), ``depth`` drafts deep and
    ``top_k`` children per node, grown best-first by each node's chance of acceptance under
    ``rates`` (c_j per sibling rank, `SiblingAcceptance.rates`); nodes in level order, siblings
    in rank order (the order they are drawn and verified in)."""
    reach, rejected = [], 1.0
    for c in rates[:top_k]:
        reach.append(rejected * c)
        rejected *= 1.0 - c
    return _best_first(tuple(round(r, 3) for r in reach), total_tokens, depth)


@lru_cache(maxsize=256)
def _best_first(reach: tuple[float, ...], total_tokens: int, depth: int) -> TreeShape:
    """Cached by the rounded reach values, so a settled estimate reuses one shape (and the
    topology the verifier derives from it) step after step."""
    nodes = [(-1, -1, 0)]  # (parent node, rank, depth) in the order they are added; the root first
    value = [1.0]
    slots = [(-reach[0], 0, 0, 0)]  # (-chance, tie-break, parent, rank)
    order = 1
    while slots and len(nodes) < total_tokens:
        chance, _, parent, rank = heapq.heappop(slots)
        nodes.append((parent, rank, nodes[parent][2] + 1))
        value.append(-chance)
        new = len(nodes) - 1
        if rank + 1 < len(reach):
            heapq.heappush(slots, (-value[parent] * reach[rank + 1], order, parent, rank + 1))
            order += 1
        if nodes[new][2] < depth:
            heapq.heappush(slots, (-value[new] * reach[0], order, new, 0))
            order += 1
    # Level order, siblings by rank: parents before children, the verifier's sibling order.
    key = [()] * len(nodes)
    for i, (parent, rank, _) in enumerate(nodes[1:], start=1):
        key[i] = (*key[parent], rank)
    ordered = sorted(range(len(nodes)), key=lambda i: (len(key[i]), key[i]))
    index = {old: new for new, old in enumerate(ordered)}
    parents = tuple(-1 if i == 0 else index[nodes[i][0]] for i in ordered)
    return TreeShape(parents)


def draw_siblings(probs: torch.Tensor, count: int, generator: torch.Generator | None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` children for each row of ``probs`` [R, V] (a processed, normalised law), drawn
    without replacement: (tokens [R, count], the law each was drawn from [R, count, V], the
    earlier siblings removed and renormalised; a point mass on the sibling before it where no
    mass was left). One uniform per row and sibling (`sampling.sample_rows`), where the laws are."""
    remaining = probs.float().clone()
    tokens, laws = [], []
    for j in range(count):
        mass = remaining.sum(-1, keepdim=True)
        law = remaining / mass.clamp(min=1e-30)
        if j:
            spent = mass <= 0
            law = torch.where(spent, torch.nn.functional.one_hot(tokens[-1], law.shape[-1]).to(law.dtype), law)
        picked = sample_rows(law, generator)
        tokens.append(picked)
        laws.append(law)
        remaining.scatter_(1, picked[:, None], 0.0)
    return torch.stack(tokens, 1), torch.stack(laws, 1)
