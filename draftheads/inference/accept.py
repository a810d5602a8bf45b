"""Which path of a verified tree is accepted, and the target's token after it: the lossless rules
and the dispatch.

- `accept_greedy_rows`: greedy for every row of a step in ONE host transfer (each row's argmaxes
  and tree tokens), then a walk of each tree's few paths in Python (`greedy_acceptance`); on a GPU
  every host read stalls the device, so a batch of B rows must not read B times.
- `accept_sampling`: lossless rejection sampling down the tree (the target's exact law), "exact".
- `accept_block`: block verification of a chain (`accept_block.block_verification`), lossless, opt-in
  (``acceptance="block"``).

`accept_rows` picks the rule for a step (`SAMPLING_RULES`: one line per ``acceptance`` setting; a
rule lives in its own module when it is not this file's, e.g. the lossy `accept_typical`); the
verifier never decides acceptance.
"""
from __future__ import annotations

import torch

from .accept_block import block_verification, is_chain
from .accept_typical import accept_typical
from .accepted import Acceptance, root_only
from .sampling import SamplingParams, sample
from .tree import Tree, TreeShape


def greedy_acceptance(shape: TreeShape, predicted: list[int], tokens: list[int]) -> Acceptance:
    """The first longest root-first path of ``shape`` whose every drafted token equals the target's
    argmax (``predicted``) at its parent, and the target's next token after it (host lists, as one
    transfer brought them back)."""
    if shape.size == 1:  # a plain step: no path to walk
        return root_only(predicted[0], tokens[0])
    best: tuple[int, ...] = (0,)
    for path in shape.leaf_paths:
        m = 1
        while m < len(path) and tokens[path[m]] == predicted[path[m - 1]]:
            m += 1
        if m > len(best):
            best = path[:m]
    if len(best) == 1:
        return root_only(predicted[0], tokens[0])
    nodes = list(best)
    return Acceptance(torch.tensor(nodes, dtype=torch.long), predicted[nodes[-1]],
                      tokens=[tokens[i] for i in nodes], _nodes=nodes)


def accept_greedy_rows(trees: list[Tree], tokens: torch.Tensor, logits: torch.Tensor) -> list[Acceptance]:
    """Per row, the longest path whose tokens all equal the target's argmax at their parent.

    ``tokens`` [rows, n] are the trees' tokens as verified (padded, on the logits' device) and
    ``logits`` [rows, n, V] the verify forward's output; one ``tolist`` brings back everything."""
    n = tokens.shape[1]
    packed = torch.cat([logits.argmax(dim=-1), tokens.to(logits.device, non_blocking=True)], dim=1).tolist()
    return [greedy_acceptance(tree.shape, row[:n], row[n:]) for tree, row in zip(trees, packed)]


def accept_root(tree: Tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> Acceptance:
    """A tree of the root alone (a plain step): nothing to accept or reject, so every rule (exact,
    block, typical) comes down to one draw from the target's processed distribution at the root,
    what `generate(do_sample=True)` draws for its next token."""
    return root_only(sample(params.probs(logits[0]), generator), tree.tokens.tolist()[0])


def accept_sampling(
    tree: Tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Acceptance:
    """Lossless rejection sampling down the tree.

    At an accepted node with target distribution p (processed like `generate` does), its
    children are tried in order. A deterministic draft x (a point mass) is accepted with
    probability r(x) where r is the current residual; on rejection r(x) is zeroed and r
    renormalised. A sampled draft x ~ q (``tree.draft_probs``) is accepted with probability
    min(1, r(x)/q(x)); on rejection r <- norm(max(r - q, 0)) (SpecInfer's rule, exact for
    siblings drawn independently from q). If every child is rejected, the next token is drawn
    from the residual; at a leaf it is drawn from p itself (the bonus token).
    """
    children = tree.shape.children
    tokens = tree.tokens.tolist()
    node, path = 0, [0]
    device = logits.device
    while True:
        # Vocabulary rows stay where the logits are: only scalars come to the host.
        residual = params.probs(logits[node])
        for child in children[node]:
            x = tokens[child]
            total = residual.sum()
            if tree.draft_probs is None:
                accept_prob = residual[x] / total
            else:
                q = tree.draft_probs[child].to(device, torch.float32, non_blocking=True)
                accept_prob = torch.clamp(residual[x] / total / q[x].clamp(min=1e-30), max=1.0)
            if float(torch.rand((), generator=generator)) < float(accept_prob):
                node = child
                path.append(child)
                break
            if tree.draft_probs is None:
                residual[x] = 0.0
            else:
                residual = torch.clamp(residual / total - q, min=0.0)
            if float(residual.sum()) <= 0.0:
                # Only reachable through float rounding: the residual is empty when the draft
                # covers p exactly, in which case acceptance had probability 1.
                residual = params.probs(logits[node])
        else:
            return Acceptance(torch.tensor(path, dtype=torch.long), sample(residual, generator),
                              tokens=[tokens[i] for i in path], _nodes=path)


def accept_block(
    tree: Tree, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Acceptance:
    """Block verification for a chain (`accept_block.block_verification`); a branching tree keeps
    `accept_sampling` (block verification is defined for chains)."""
    if not is_chain(tree.shape):
        return accept_sampling(tree, logits, params, generator)
    nodes, next_token = block_verification(tree, logits, params, generator)
    tokens = tree.tokens[: len(nodes)].tolist()
    return Acceptance(torch.tensor(nodes, dtype=torch.long), next_token, tokens=tokens, _nodes=nodes)


#: The sampling rule of each ``acceptance`` setting, `accept_sampling` first (the default; greedy
#: decoding is always exact). A rule takes (tree, logits [n, V], params, generator) -> `Acceptance`.
SAMPLING_RULES = {
    "exact": accept_sampling,
    "block": accept_block,
    "typical": accept_typical,
}
ACCEPTANCE = tuple(SAMPLING_RULES)


def accept_rows(
    trees: list[Tree],
    tokens: torch.Tensor,
    logits: torch.Tensor,
    params: SamplingParams,
    acceptance: str,
    generator: torch.Generator | None,
) -> list[Acceptance]:
    """One step's acceptance for every row (``tokens`` [rows, n] and ``logits`` [rows, n, V] as
    verified; trees padded to n): greedy at temperature 0 (one transfer), else the sampling rule."""
    if params.greedy:
        return accept_greedy_rows(trees, tokens, logits)
    rule = SAMPLING_RULES[acceptance]
    return [(accept_root if tree.shape.size == 1 else rule)(tree, logits[r, : tree.shape.size], params, generator)
            for r, tree in enumerate(trees)]
