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



def test_eagle_draws_as_many_verify_tokens_as_the_drawn_chain_it_replaces(monkeypatch):
    """A drawn tree verifies depth + 1 tokens at most: a plan timed with drawn chains costs the same."""
    import draftheads as dh
    import draftheads.inference.loop as loop
    from inference_utils import tiny_target

    seen = []
    accept = loop.accept_rows
    monkeypatch.setattr(loop, "accept_rows", lambda trees, *a, **k: (seen.extend(trees), accept(trees, *a, **k))[1])
    target = tiny_target("llama", seed=3, vocab=16, hidden=32, layers=2)
    torch.manual_seed(0)
    heads = dh.EagleHead.for_target(target, num_heads=1)
    for tree, verified in (({"total_tokens": 12, "depth": 3, "top_k": 4}, 4), ({"total_tokens": 5, "depth": 7, "top_k": 2}, 5)):
        seen.clear()
        decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draft_budget=None, batch_plan=None)
        out = decoder.generate(torch.tensor([[1, 4, 3]]), max_new_tokens=24, temperature=1.0, eos_token_id=[], seed=0)
        assert out.stats.get("drawn_sibling_acceptance"), "no tree was drawn"
        sizes = {t.shape.size for t in seen}
        assert max(sizes) == verified, f"{tree}: drawn trees of {sorted(sizes)} tokens, want {verified}"
        assert any(max(len(k) for k in t.shape.children) > 1 for t in seen), "only chains were drawn"


def test_the_same_seed_draws_the_same_tree_tokens_request_after_request():
    """Sibling acceptance is learned per generation: the second request with a seed samples what the first did."""
    import draftheads as dh
    from inference_utils import tiny_target

    target = tiny_target("llama", seed=3, vocab=16, hidden=32, layers=2)
    torch.manual_seed(0)
    decoder = dh.SpeculativeDecoder(target, dh.EagleHead.for_target(target, num_heads=1), draft_budget=None,
                                    tree={"total_tokens": 6, "depth": 5, "top_k": 2}, batch_plan=None)
    runs = [decoder.generate(torch.tensor([[1, 4, 3]]), max_new_tokens=24, temperature=1.0, eos_token_id=[], seed=5)
            for _ in range(2)]
    assert runs[0].stats.get("drawn_sibling_acceptance"), "no tree was drawn"
    assert runs[0].sequences.tolist() == runs[1].sequences.tolist(), "the same seed drew different tokens"
