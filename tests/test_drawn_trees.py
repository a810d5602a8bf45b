"""Drawn trees (`inference.proposers.drawn_trees`): siblings drawn without replacement keep the
target's law under the verifier's rule when each is told its conditional law, and are caught when
told the parent's whole law; the shape follows the measured sibling acceptance."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from draftheads.inference.accept import accept_sampling
from draftheads.inference.proposers.drawn_trees import SiblingAcceptance, draw_siblings, fitted_shape
from draftheads.inference.sampling import SamplingParams
from draftheads.inference.tree import Tree, TreeShape

from stats import law_pvalue

P = torch.tensor([0.5, 0.3, 0.1, 0.05, 0.05])
DRAWS = 8000


def emitted_law(q: torch.Tensor, siblings: int, conditional: bool, draws: int = DRAWS) -> Counter:
    """The first token a one-level tree of ``siblings`` drawn from ``q`` emits, ``draws`` times:
    its accepted draft, else the verifier's draw from the residual."""
    gen = torch.Generator().manual_seed(7)
    shape = TreeShape((-1, *[0] * siblings))
    logits = P.log()[None].expand(siblings + 1, -1).clone()
    counts: Counter = Counter()
    for _ in range(draws):
        tokens, laws = draw_siblings(q[None], siblings, gen)
        if not conditional:  # SpecInfer's rule for independent draws: every sibling told q itself
            laws = q[None, None].expand_as(laws)
        tree = Tree(shape, torch.cat([torch.zeros(1, dtype=torch.long), tokens[0]]),
                    torch.cat([torch.zeros(1, q.numel()), laws[0]]))
        acc = accept_sampling(tree, logits, SamplingParams(temperature=1.0), gen)
        counts[(tree.tokens[acc.path].tolist() + [acc.next_token])[1],] += 1
    return counts


def target_law() -> dict:
    return {(i,): float(p) for i, p in enumerate(P)}


@pytest.mark.parametrize("q, siblings", [
    (torch.tensor([0.1, 0.1, 0.4, 0.2, 0.2]), 3),
    (torch.tensor([0.0, 0.0, 0.7, 0.3, 0.0]), 3),  # the third sibling has no mass left: a point mass
], ids=["three-siblings", "mass-runs-out"])
def test_siblings_drawn_without_replacement_keep_the_target_law(q, siblings):
    pvalue = law_pvalue(emitted_law(q, siblings, conditional=True), target_law())
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: not the target's law"


def test_siblings_told_the_parents_whole_law_are_caught():
    """The test has teeth: the exact law of this misreport is 8% (total variation) off the target's."""
    counts = emitted_law(torch.tensor([0.1, 0.1, 0.4, 0.2, 0.2]), 3, conditional=False)
    pvalue = law_pvalue(counts, target_law())
    assert pvalue < 1e-3, f"a sibling law with replacement went unnoticed (chi-square p-value {pvalue:.2g})"


def test_draw_siblings_removes_each_drawn_token_from_the_next_law():
    gen = torch.Generator().manual_seed(0)
    q = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.0, 1.0, 0.0, 0.0]])
    tokens, laws = draw_siblings(q, 3, gen)
    assert torch.allclose(laws.sum(-1), torch.ones(2, 3))
    first = tokens[0].tolist()
    assert len(set(first)) == 3 and 3 not in first
    for j in range(1, 3):
        assert all(float(laws[0, j, t]) == 0.0 for t in first[:j])
    # the second row has one token with mass: every later sibling is a point mass on it
    assert tokens[1].tolist() == [1, 1, 1] and torch.equal(laws[1, 1], torch.tensor([0.0, 1.0, 0.0, 0.0]))


def test_fitted_shape_keeps_the_budget_and_follows_the_rates():
    for rates in ([0.5, 0.5], [0.95, 0.2, 0.2], [0.2, 0.3, 0.3, 0.3]):
        shape = fitted_shape(rates, total_tokens=8, depth=4, top_k=len(rates))
        assert shape.size == 8 and shape.max_depth <= 4
        assert max(len(k) for k in shape.children) <= len(rates)
        depths = shape.depth.tolist()
        assert depths == sorted(depths), "nodes in level order"
    assert fitted_shape([0.95, 0.2], 6, 5, 2).parents == (-1, 0, 1, 2, 3, 4), "a sure first sibling: a chain"
    bushy = fitted_shape([0.2, 0.3, 0.3], 4, 5, 3)
    assert bushy.parents == (-1, 0, 0, 0), "an unlikely first sibling: every sibling of the root first"
    assert fitted_shape([0.5, 0.5], 20, 2, 2).size == 7, "a full tree of depth 2, top 2, whatever the budget"


def test_sibling_acceptance_counts_the_tries_down_the_accepted_path():
    # root -> a(5), b(6); a -> c(7), d(8); b -> e(9)
    tree = Tree(TreeShape((-1, 0, 0, 1, 1, 2)), torch.tensor([1, 5, 6, 7, 8, 9]))
    counts = SiblingAcceptance(top_k=2)
    counts.record(tree, [1, 5, 8])  # a accepted at rank 0; under a, c rejected then d accepted (rank 1)
    assert counts.hits == [2.0, 2.0] and counts.tries == [4.0, 3.0]
    counts.record(tree, [1, 6])  # a rejected, b accepted; b's only child e rejected
    assert counts.hits == [2.0, 3.0] and counts.tries == [6.0, 4.0]
    counts.record(Tree(TreeShape((-1, 0, 0)), torch.tensor([1, 5, 5])), [1])  # the point mass is no try
    assert counts.tries == [7.0, 4.0]
