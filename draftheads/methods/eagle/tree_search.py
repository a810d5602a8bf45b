"""EAGLE-2's tree growth and rerank for a batch of rows, for `eagle.EagleDrafter` (every row of a
batch in one draft-layer forward per depth; a batch of one is one sequence).

Every row expands exactly ``top_k`` nodes per depth, so the rows stay aligned: the same number
of nodes, the same cache slots for the tree part, different tokens and parents. Only each row's
committed draft cache differs (its length, and in a batch, holes), which the caller describes
with a per-row visibility mask over the committed slots and the position of each row's root.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...inference.sampling import SamplingParams
from ...inference.tree import Tree, TreeShape
from ...inference.proposers.drawn_trees import draw_siblings
from ...inference.proposers.sampled import draw


def grow(
    head: torch.nn.Module,
    logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_ids: torch.Tensor | None,
    cache: list[tuple[torch.Tensor, torch.Tensor]],
    visible: torch.Tensor,
    first_pos: torch.Tensor,
    root_states: torch.Tensor,
    depth: int,
    top_k: int,
    rescore: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every node of each row's dynamic tree, ``depth`` levels deep: (draft-vocab tokens, parent
    node ids (root = 0, node i = entry i - 1), joint log-scores), each [rows, nodes] in creation
    order, ``top_k + (depth - 1) * top_k**2`` nodes.

    A node's log-score is the sum along its path of each step's log-probability (EAGLE-2), or,
    with ``rescore`` (`heads.confidence.ConfidenceCalibration.rescore`), of what that maps each step's
    ranked log-probabilities [..., top_k] to: the log of the measured chance that the target
    accepts a candidate of that rank and confidence. Either way a child never outscores its parent.

    ``visible`` [rows, T] bool: the committed cache slots each row attends to (the tree part is
    written after slot T, then dropped); ``first_pos`` [rows]: the position of each row's first
    drafted level (its committed draft length, what the draft layer's RoPE sees);
    ``root_states`` [rows, d]: the draft state at the root."""
    k, dev = top_k, root_states.device
    rows, width = root_states.shape
    prefix = visible.shape[1]
    def ranked(states: torch.Tensor):
        top = logits(states).float().log_softmax(-1).topk(k, dim=-1)
        return top.indices, top.values if rescore is None else rescore(top.values)

    top_indices, top_values = ranked(root_states)
    tokens, parents, scores = [top_indices], [torch.zeros(rows, k, dtype=torch.long, device=dev)], [top_values]
    frontier = torch.arange(1, k + 1, device=dev).expand(rows, k)  # node ids of the nodes to expand next
    frontier_states = root_states[:, None].expand(rows, k, width)  # their parents' draft states
    frontier_tokens = top_indices
    max_expanded = k * (depth - 1)
    # anc[r, i, j]: in row r, expanded node j is expanded node i's ancestor or itself (tree-part slots)
    anc = torch.zeros(rows, max_expanded, max_expanded, dtype=torch.bool, device=dev)
    slot_of = torch.full((rows, 1 + k + (depth - 1) * k * k), -1, dtype=torch.long, device=dev)
    expanded, created = 0, k
    arange_k = torch.arange(k, device=dev)
    for level in range(1, depth):
        new_slots = expanded + arange_k  # every row expands k nodes, into the same slots
        parent_slot = slot_of.gather(1, torch.cat(parents, 1).gather(1, frontier - 1))  # -1: the root
        sees = anc.gather(1, parent_slot.clamp(min=0)[..., None].expand(-1, -1, max_expanded))
        sees &= (parent_slot >= 0)[..., None]
        sees[:, arange_k, new_slots] = True
        anc[:, new_slots] = sees
        slot_of.scatter_(1, frontier, new_slots.expand(rows, k))
        mask = torch.cat([visible[:, None].expand(rows, k, prefix), sees[:, :, : expanded + k]], dim=2)
        fed = frontier_tokens if vocab_ids is None else vocab_ids[frontier_tokens]
        g, attn_in = head.next_input(frontier_states, fed)
        positions = (first_pos + level - 1)[:, None].expand(rows, k)
        out, _ = head.run_layers(g, attn_in, positions, mask, cache=cache, cache_length=prefix + expanded)
        expanded += k

        best_indices, best_values = ranked(out)  # [rows, k, k]
        cand_scores = (torch.cat(scores, 1).gather(1, frontier - 1)[..., None] + best_values).reshape(rows, -1)
        tokens.append(best_indices.reshape(rows, -1))
        parents.append(frontier.repeat_interleave(k, dim=1))
        scores.append(cand_scores)
        keep = cand_scores.topk(k, dim=-1).indices
        frontier = created + 1 + keep
        frontier_states = out.gather(1, (keep // k)[..., None].expand(-1, -1, width))
        frontier_tokens = tokens[-1].gather(1, keep)
        created += cand_scores.shape[1]
    return torch.cat(tokens, 1), torch.cat(parents, 1), torch.cat(scores, 1)


def draw_chain(
    head: torch.nn.Module,
    logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_ids: torch.Tensor | None,
    cache: list[tuple[torch.Tensor, torch.Tensor]],
    visible: torch.Tensor,
    first_pos: torch.Tensor,
    root_states: torch.Tensor,
    depth: int,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each row's chain of ``depth`` drafts DRAWN from the draft layer's processed distribution
    (`sampled`), the next level fed the drawn token, as `grow` feeds its top-k: (target ids [rows]
    per level, their laws over the target's vocabulary [rows, V] per level). Arguments as `grow`'s;
    the chain's slots after the committed ones are scratch, as the tree's are."""
    prefix = visible.shape[1]
    rows = root_states.shape[0]
    drafted, laws = [], []
    state = root_states[:, None]  # [rows, 1, d]
    for level in range(depth):
        if level:
            g, attn_in = head.next_input(state, drafted[-1][:, None])
            mask = torch.cat([visible, visible.new_ones(rows, level)], dim=1)[:, None]
            positions = (first_pos + level - 1)[:, None]
            state, _ = head.run_layers(g, attn_in, positions, mask, cache=cache, cache_length=prefix + level - 1)
        token, law = draw(logits(state[:, 0]), params, generator, vocab_ids, head.config.vocab_size)
        drafted.append(token)
        laws.append(law)
    return drafted, laws


def draw_tree(
    head: torch.nn.Module,
    logits: Callable[[torch.Tensor], torch.Tensor],
    vocab_ids: torch.Tensor | None,
    cache: list[tuple[torch.Tensor, torch.Tensor]],
    visible: torch.Tensor,
    first_pos: torch.Tensor,
    root_states: torch.Tensor,
    shape: TreeShape,
    params: SamplingParams,
    generator: torch.Generator | None,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's drafts in ``shape`` (one topology for every row, `drawn_trees.fitted_shape`),
    every node's children DRAWN without replacement from the draft layer's processed law at that
    node (`drawn_trees.draw_siblings`), level by level: (target ids [rows, n], slot 0 unused; the
    law each node was drawn from over the target's vocabulary [rows, n, vocab_size], row 0 zero).

    One draft-layer forward per level runs every node of that level that has children, fed its
    drawn token and its parent's state, each attending to the committed slots its row sees and its
    own ancestors (the tree part's slots are scratch, as in `grow`). Arguments as `draw_chain`'s."""
    rows, n = root_states.shape[0], shape.size
    dev, prefix = root_states.device, visible.shape[1]
    levels = shape.depth.tolist()
    tokens = torch.zeros(rows, n, dtype=torch.long, device=dev)  # draft-vocabulary indices
    laws: torch.Tensor | None = None
    states = {0: root_states}
    slot: dict[int, int] = {}  # an expanded node's scratch slot after the committed ones
    for level in range(shape.max_depth):
        expand = [u for u in range(n) if levels[u] == level and shape.children[u]]
        if level == 0:
            out = root_states[:, None]
        else:
            base = len(slot)
            for i, u in enumerate(expand):
                slot[u] = base + i
            sees = torch.zeros(len(expand), base + len(expand), dtype=torch.bool)
            for i, u in enumerate(expand):
                a = u
                while a > 0:
                    sees[i, slot[a]] = True
                    a = shape.parents[a]
            fed = tokens[:, expand] if vocab_ids is None else vocab_ids[tokens[:, expand]]
            g, attn_in = head.next_input(torch.stack([states[shape.parents[u]] for u in expand], 1), fed)
            mask = torch.cat([visible[:, None].expand(rows, len(expand), prefix),
                              sees.to(dev, non_blocking=True)[None].expand(rows, -1, -1)], dim=2)
            positions = (first_pos + level - 1)[:, None].expand(rows, len(expand))
            out, _ = head.run_layers(g, attn_in, positions, mask, cache=cache, cache_length=prefix + base)
            states.update({u: out[:, i] for i, u in enumerate(expand)})
        probs = params.probs(logits(out).float())  # [rows, len(expand), V']
        if laws is None:
            laws = probs.new_zeros(rows, n, probs.shape[-1])
        for i, u in enumerate(expand):
            kids = list(shape.children[u])
            picked, kid_laws = draw_siblings(probs[:, i], len(kids), generator)
            tokens[:, kids] = picked
            laws[:, kids] = kid_laws
    if vocab_ids is None:
        return tokens, laws
    vocab_ids = vocab_ids.to(dev)
    full = laws.new_zeros(rows, n, vocab_size).index_copy_(2, vocab_ids, laws)
    return vocab_ids[tokens], full


def nodes_up_to(depth: int, top_k: int) -> int:
    """How many nodes `grow` creates in its first ``depth`` levels."""
    return top_k + (depth - 1) * top_k * top_k


def select(roots: list[int], tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, nodes: list[int],
           total_tokens: int, vocab_ids: torch.Tensor | None) -> list[Tree]:
    """Each row's best ``total_tokens - 1`` of its first ``nodes[r]`` nodes (``grow``'s output),
    re-indexed into a tree (creation order keeps parents first). A child's joint probability never
    exceeds its parent's, so the kept set is connected. The ranking runs where the nodes are; the
    kept nodes come to the host in one transfer."""
    rows, created = scores.shape
    budget = min(total_tokens - 1, max(nodes))
    limit = torch.tensor(nodes, device=scores.device)[:, None]
    beyond = torch.arange(created, device=scores.device)[None] >= limit  # a row drafting shallower
    ranked = (-scores).masked_fill(beyond, float("inf"))
    # Stable ascending sort of -score: on equal scores the earlier-created node (a parent) wins.
    order = torch.sort(ranked, dim=1, stable=True).indices[:, :budget]
    picked = tokens.gather(1, order)
    if vocab_ids is not None:
        picked = vocab_ids[picked]
    kept = torch.stack([order, picked, parents.gather(1, order)], dim=1).tolist()  # the one transfer
    trees = []
    for root, n, (node_order, node_tokens, node_parents) in zip(roots, nodes, kept):
        best = list(zip(node_order, node_tokens, node_parents))[: min(total_tokens - 1, n)]
        chosen = sorted(best)  # creation order: parents before children
        new_id = {0: 0}
        new_parents, drafted = [-1], [root]
        for j, (index, token, parent) in enumerate(chosen, start=1):
            new_id[index + 1] = j
            new_parents.append(new_id[parent])
            drafted.append(token)
        trees.append(Tree(TreeShape(tuple(new_parents)), torch.tensor(drafted)))
    return trees
