"""Block verification is lossless on chains: a step's emitted tokens, completed by the target's own
sampling to a fixed length, follow the target's law exactly (chi-square, tests/stats.py), at
T=0.7 and T=1.0, with and without top-k/top-p, for sampled and for point-mass drafts. The same
test rejects block verification with a deliberately wrong residual or threshold.

The world is a table of logits for every prefix of a tiny vocabulary (no model): a step's
drafts, target rows and draft laws can be drawn thousands of times in seconds.
"""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

import draftheads.inference.accept_block as block
from draftheads.inference.accept import accept_block, accept_sampling
from draftheads.inference.sampling import SamplingParams
from draftheads.inference.tree import Tree, TreeShape

from stats import chi_square_pvalue, law_pvalue

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # thousands of tiny ops: threads only contend

V = 5
DEPTH = 3  # drafts per chain: block verification differs from token-by-token from 2 on
ROOT = 0
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=4, top_p=0.9),
    SamplingParams(temperature=0.7, top_k=4, top_p=0.95),
]
IDS = ["t1.0", "t0.7", "t1.0-topk4-topp0.9", "t0.7-topk4-topp0.95"]


class ChainWorld:
    """Target and draft logits for every prefix (after the root) of up to DEPTH tokens; the draft
    is deliberately far from the target so that a wrong rule moves real mass."""

    def __init__(self, params: SamplingParams, seed: int = 0) -> None:
        self.params = params
        gen = torch.Generator().manual_seed(seed)
        self.target: dict[tuple[int, ...], torch.Tensor] = {}
        self.draft: dict[tuple[int, ...], torch.Tensor] = {}
        for length in range(DEPTH + 1):
            for prefix in itertools.product(range(V), repeat=length):
                t = 2.0 * torch.randn(V, generator=gen)
                self.target[prefix] = t
                self.draft[prefix] = 0.4 * t + 1.5 * torch.randn(V, generator=gen)
        prefixes = list(self.target)
        p = params.probs(torch.stack([self.target[k] for k in prefixes]))  # processed once, for speed
        q = params.probs(torch.stack([self.draft[k] for k in prefixes]))
        self._p = dict(zip(prefixes, p))
        self._q = dict(zip(prefixes, q))

    def p(self, prefix) -> torch.Tensor:
        return self._p[tuple(prefix)]

    def q(self, prefix) -> torch.Tensor:
        return self._q[tuple(prefix)]

    def exact(self) -> dict[tuple[int, ...], float]:
        """The target's law of the first DEPTH + 1 tokens after the root (chain rule)."""
        law = {}
        for seq in itertools.product(range(V), repeat=DEPTH + 1):
            mass = 1.0
            for i in range(DEPTH + 1):
                mass *= float(self.p(seq[:i])[seq[i]])
            if mass > 0:
                law[seq] = mass
        return law

    def step(self, gen: torch.Generator, sampled: bool) -> Tree:
        """One chain of DEPTH drafts: sampled from q (with their laws), or the target's argmaxes
        (point masses, as heads trained on the target's greedy tokens draft them)."""
        drafts: list[int] = []
        laws = [torch.zeros(V)]
        for _ in range(DEPTH):
            q = self.q(drafts)
            x = int(torch.multinomial(q, 1, generator=gen)) if sampled else int(self.p(drafts).argmax())
            drafts.append(x)
            laws.append(q)
        return Tree(TreeShape.chain(DEPTH), torch.tensor([ROOT, *drafts]), torch.stack(laws) if sampled else None)

    def logits(self, tree: Tree) -> torch.Tensor:
        drafts = tree.tokens[1:].tolist()
        return torch.stack([self.target[tuple(drafts[:i])] for i in range(DEPTH + 1)])

    def run(self, accept, trials: int, sampled: bool, seed: int = 0) -> tuple[Counter, list[int]]:
        """Counts of the first DEPTH + 1 tokens (a step's emission, then the target's own samples),
        and each step's number of accepted drafts."""
        gen = torch.Generator().manual_seed(seed)
        counts: Counter = Counter()
        accepted = []
        for _ in range(trials):
            tree = self.step(gen, sampled)
            acc = accept(tree, self.logits(tree), self.params, gen)
            emitted = tree.tokens[acc.path[1:]].tolist() + [acc.next_token]
            accepted.append(len(emitted) - 1)
            while len(emitted) < DEPTH + 1:  # what later steps decode: the target's law
                emitted.append(int(torch.multinomial(self.p(emitted), 1, generator=gen)))
            counts[tuple(emitted)] += 1
        return counts, accepted


TRIALS = 6000


@pytest.mark.parametrize("sampled", [True, False], ids=["sampled", "point-mass"])
@pytest.mark.parametrize("params", PARAMS, ids=IDS)
def test_block_verification_draws_the_target_law(params, sampled):
    world = ChainWorld(params)
    counts, accepted = world.run(accept_block, TRIALS, sampled)
    pvalue = law_pvalue(counts, world.exact())
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: block verification is not the target's law"
    # every stop was exercised, the whole block too: the test judged more than the residual
    assert set(accepted) == set(range(DEPTH + 1)), f"accepted lengths seen: {sorted(set(accepted))}"


def unscaled_residual(credit, p, q):
    """The classic slip: the token-by-token residual max(p - q, 0), without the block's credit."""
    return torch.clamp(p - q, min=0.0)


def uncredited_thresholds(probs, q, credits):
    """Another slip: h_i = R_i / (R_i + 1), the prefix's unused credit 1 - P_i forgotten."""
    g = q.shape[0]
    mass = block.residual(credits[1:g, None], probs[1:g], q[1:g]).sum(-1)
    return torch.cat([mass / (mass + 1.0), credits[g:]])


@pytest.mark.parametrize("bug", ["residual", "thresholds"])
@pytest.mark.parametrize("params", [PARAMS[0], PARAMS[3]], ids=[IDS[0], IDS[3]])
def test_a_wrong_block_rule_fails_the_same_test(params, bug, monkeypatch):
    if bug == "residual":
        monkeypatch.setattr(block, "residual", unscaled_residual)
    else:
        monkeypatch.setattr(block, "thresholds", uncredited_thresholds)
    world = ChainWorld(params)
    counts, _ = world.run(accept_block, TRIALS, sampled=True)
    pvalue = law_pvalue(counts, world.exact())
    assert pvalue < 1e-3, f"the test did not catch a wrong {bug} (chi-square p-value {pvalue:.2g})"


@pytest.mark.parametrize("params", [PARAMS[0], PARAMS[1]], ids=IDS[:2])
def test_block_verification_accepts_at_least_token_by_token(params):
    """Its point: on sampled drafts the block rule accepts more per step than judging drafts one at
    a time (same world, same seeds); on point masses both accept the target's own odds."""
    world = ChainWorld(params)
    _, block_sampled = world.run(accept_block, TRIALS, sampled=True)
    _, token_sampled = world.run(accept_sampling, TRIALS, sampled=True)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    assert mean(block_sampled) > mean(token_sampled) + 0.02, (mean(block_sampled), mean(token_sampled))
    _, block_points = world.run(accept_block, TRIALS, sampled=False)
    _, token_points = world.run(accept_sampling, TRIALS, sampled=False)
    assert abs(mean(block_points) - mean(token_points)) < 0.05, (mean(block_points), mean(token_points))


def test_a_branching_tree_keeps_recursive_rejection():
    """acceptance="block" on a tree is `accept_sampling` draw for draw (block verification is for chains)."""
    shape = TreeShape.from_choices([[0], [1], [0, 0]])
    tree = Tree(shape, torch.tensor([ROOT, 1, 2, 3]))
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(5))
    params = SamplingParams(temperature=1.0)
    for seed in range(20):
        a = accept_block(tree, logits, params, torch.Generator().manual_seed(seed))
        b = accept_sampling(tree, logits, params, torch.Generator().manual_seed(seed))
        assert a.nodes == b.nodes and a.next_token == b.next_token
    with pytest.raises(ValueError, match="chain"):
        block.block_verification(tree, logits, params, None)


def test_generate_with_block_verification_draws_the_target_law():
    """End to end through `generate(acceptance="block")`: a draft LM samples a chain of two drafts
    in the first step (4 new tokens), so the block rule judges (t2, t3); their law must be the target's."""
    from proposer_utils import tiny_lm

    import draftheads as dh

    v = 8
    target = tiny_lm("llama", seed=11, vocab=v, hidden=16, layers=1, initializer_range=0.3)
    draft = tiny_lm("qwen2", seed=12, vocab=v, hidden=16, layers=1, initializer_range=0.3)
    ids = torch.tensor([[1, 4, 6, 2]])
    params = SamplingParams(temperature=1.0)
    pairs = torch.cartesian_prod(torch.arange(v), torch.arange(v))
    with torch.no_grad():
        logits = target(input_ids=torch.cat([ids.expand(len(pairs), -1), pairs], dim=1)).logits
    p1, p2 = params.probs(logits[0, -3]), params.probs(logits[::v, -2])
    p3 = params.probs(logits[:, -1]).reshape(v, v, v)
    exact = (p1[:, None, None] * p2[:, :, None] * p3).sum(0)  # law of (t2, t3)
    decoder = dh.SpeculativeDecoder(target, dh.DraftModelProposer(draft, gamma=2))
    gen = torch.Generator().manual_seed(0)
    counts, blocks = torch.zeros(v, v), 0
    for _ in range(400):  # the wiring: the power is in the tests above
        out = decoder.generate(ids, max_new_tokens=4, temperature=1.0, generator=gen, eos_token_id=[],
                               acceptance="block")
        t2, t3 = out.sequences[0, -3:-1].tolist()
        counts[t2, t3] += 1
        blocks += out.stats["gamma_histogram"].get(2, 0) > 0
    assert blocks == 400  # every run judged a block of two sampled drafts
    assert chi_square_pvalue(counts, exact) > 1e-3


def test_unknown_acceptance_names_the_choices():
    from proposer_utils import tiny_lm

    import draftheads as dh

    target = tiny_lm("llama", seed=11, vocab=8, hidden=16, layers=1)
    decoder = dh.SpeculativeDecoder(target, dh.DraftModelProposer(target, gamma=2))
    with pytest.raises(ValueError, match="'exact' or 'block' or 'typical'"):
        decoder.generate(torch.tensor([[1, 2]]), max_new_tokens=2, temperature=1.0, acceptance="blocks")


def test_block_is_opt_in():
    """"exact" stays recursive rejection; "block" verifies chains by blocks (and trees by
    recursive rejection, `test_a_branching_tree_keeps_recursive_rejection`)."""
    from draftheads.inference.accept import ACCEPTANCE, SAMPLING_RULES

    assert SAMPLING_RULES["exact"] is accept_sampling
    assert SAMPLING_RULES["block"] is accept_block
    assert ACCEPTANCE[0] == "exact" and "block" in ACCEPTANCE
