"""Sampling is lossless: the output distribution equals the target's processed distribution.

The exact distribution of the first three generated tokens is computed by the chain rule over
every prefix; the empirical distribution of thousands of seeded `generate` runs must pass a
chi-square test against it, and a deliberately biased acceptance rule must fail the same test.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from transformers import DynamicCache

import draftheads as dh
from draftheads.inference.sampling import SamplingParams
from draftheads.inference.tree import Tree, TreeShape
from draftheads.inference.accept import accept_sampling
from draftheads.inference.accept_typical import accept_typical
from draftheads.inference.verify import TreeVerifier

from inference_utils import tiny_target
from stats import biased_accept_sampling, law_pvalue

VOCAB = 6
TREE = [[0], [1], [0, 0], [0, 1], [1, 0]]  # two candidates per step, depth 2: siblings and chains


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    prompt = torch.tensor([[1, 4, 3]])
    return target, heads, prompt


# -- the verifier alone: thousands of acceptance draws on one scored tree ---------------------------
def scored_tree(target, prompt):
    """A tree (root, two children, three grandchildren) drafted from the target's own likely
    tokens, so that drafts are accepted at both depths, and the target's logits at each node."""
    shape = TreeShape.from_choices(TREE)  # nodes: root, [0], [1], [0,0], [0,1], [1,0]
    root = 2

    def top(prefix: list[int], k: int) -> list[int]:
        with torch.no_grad():
            logits = target(torch.cat([prompt, torch.tensor([prefix])], dim=1)).logits[0, -1]
        return logits.topk(k).indices.tolist()

    a, b = top([root], 2)
    aa, ab = top([root, a], 2)
    (ba,) = top([root, b], 1)
    tokens = torch.tensor([root, a, b, aa, ab, ba])
    verifier = TreeVerifier(target)
    with torch.no_grad():
        cache = DynamicCache()
        target(prompt, use_cache=True, **{verifier.cache_arg: cache})
        logits, _ = verifier.forward(cache, Tree(shape, tokens), prompt.shape[1])
    return Tree(shape, tokens), logits


def exact_emission_law(tree: Tree, logits: torch.Tensor, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """What one step must emit: x ~ p(node); if x is a drafted child, the step goes on from it.

    This is the target's own autoregressive law, cut where the tree ends."""
    law: dict[tuple[int, ...], float] = {}

    def walk(node: int, prefix: tuple[int, ...], mass: float) -> None:
        probs = params.probs(logits[node])
        child_of = {int(tree.tokens[c]): c for c in tree.shape.children[node]}
        for x in range(VOCAB):
            p = mass * float(probs[x])
            if x in child_of:
                walk(child_of[x], prefix + (x,), p)
            elif p > 0:
                law[prefix + (x,)] = p

    walk(0, (), 1.0)
    return law


def draw_emissions(accept, tree, logits, params, draws: int) -> Counter:
    gen = torch.Generator().manual_seed(99)
    counts: Counter = Counter()
    for _ in range(draws):
        acc = accept(tree, logits, params, gen)
        counts[tuple(tree.tokens[acc.path[1:]].tolist()) + (acc.next_token,)] += 1
    return counts


DRAWS = 20000
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4, top_p=0.9)]


@pytest.mark.parametrize("params", PARAMS, ids=["t1.0", "t0.7-topk4-topp0.9"])
def test_tree_acceptance_draws_the_target_distribution(setup, params):
    target, _, prompt = setup
    tree, logits = scored_tree(target, prompt)
    law = exact_emission_law(tree, logits, params)
    assert abs(sum(law.values()) - 1) < 1e-5
    counts = draw_emissions(accept_sampling, tree, logits, params, DRAWS)
    pvalue = law_pvalue(counts, law)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: accepted tokens are not the target's law"
    # Drafts were accepted, at both depths: the test exercised the tree, not just the residual.
    assert any(len(k) == 3 for k in counts) and any(len(k) == 2 for k in counts)


@pytest.mark.parametrize("params", PARAMS, ids=["t1.0", "t0.7-topk4-topp0.9"])
def test_biased_acceptance_rule_is_caught(setup, params):
    target, _, prompt = setup
    tree, logits = scored_tree(target, prompt)
    law = exact_emission_law(tree, logits, params)
    counts = draw_emissions(biased_accept_sampling("resample_from_p"), tree, logits, params, DRAWS)
    pvalue = law_pvalue(counts, law)
    assert pvalue < 1e-3, f"the test failed to detect a biased sampler (chi-square p-value {pvalue:.2g})"


# -- the whole decode loop: prefill sampling, trees, commit, several steps --------------------------
NEW = 3  # the root comes from the prefill, so 3 new tokens leave room for one drafted level
RUNS = 2500


def exact_distribution(target, prompt, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x1, ..., x_NEW | prompt) by the chain rule with the processed per-step distributions."""
    dist = {}
    with torch.no_grad():
        for seq in itertools.product(range(VOCAB), repeat=NEW - 1):
            ids = torch.cat([prompt, torch.tensor([seq], dtype=torch.long)], dim=1)
            probs = params.probs(target(ids).logits[0, -NEW:])
            p_prefix = math.prod(float(probs[i, seq[i]]) for i in range(NEW - 1))
            for last in range(VOCAB):
                dist[(*seq, last)] = p_prefix * float(probs[-1, last])
    return dist


def empirical_counts(decoder, prompt, params: SamplingParams, runs: int = RUNS) -> Counter:
    gen = torch.Generator().manual_seed(1234)
    counts: Counter = Counter()
    for _ in range(runs):
        out = decoder.generate(
            prompt, max_new_tokens=NEW, temperature=params.temperature, top_k=params.top_k,
            top_p=params.top_p, eos_token_id=[], generator=gen,
        )
        counts[tuple(out.sequences[0, prompt.shape[1] :].tolist())] += 1
    return counts


def test_generate_samples_the_target_distribution(setup):
    target, heads, prompt = setup
    params = SamplingParams(temperature=0.9, top_k=5)
    decoder = dh.SpeculativeDecoder(target, heads, tree=TREE, draw_drafts=False)  # top-k trees (drawn: test_drawn_drafts)
    dist = exact_distribution(target, prompt, params)
    assert abs(sum(dist.values()) - 1) < 1e-5
    counts = empirical_counts(decoder, prompt, params)
    pvalue = law_pvalue(counts, dist)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: output distribution differs from the target's"
    assert drafts_accepted(decoder, prompt, params) >= 5, "drafts were (almost) never accepted: the test would be vacuous"


def drafts_accepted(decoder, prompt, params: SamplingParams, runs: int = 50) -> int:
    """In how many of ``runs`` seeded generations a drafted token was accepted."""
    return sum(
        max(decoder.generate(prompt, max_new_tokens=NEW, temperature=params.temperature, top_k=params.top_k,
                             top_p=params.top_p, eos_token_id=[], seed=s).accept_lengths, default=1) > 1
        for s in range(runs)
    )


def test_processed_probs_follow_transformers_warpers():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.5, -1.0, 3.0]])
    probs = SamplingParams(temperature=0.5, top_k=3, top_p=0.8).probs(logits)[0]
    # top-k keeps {5, 0, and both tied 1.0 tokens}; top-p 0.8 then keeps the smallest head set.
    assert probs[4] == 0 and probs[3] == 0
    assert torch.isclose(probs.sum(), torch.tensor(1.0))
    assert probs.argmax() == 5
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=0.0)


def test_typical_acceptance_is_opt_in_and_follows_its_threshold(setup):
    target, heads, prompt = setup
    tree, logits = scored_tree(target, prompt)
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    # a threshold of 1 (min(1, 10 e^-H) = 1 here) rejects every draft -> only the root, a plain step
    assert accept_typical(tree, logits, params, gen, epsilon=1.0, delta=10.0).path.tolist() == [0]
    # a negative threshold accepts every draft: the deepest path is taken
    deep = accept_typical(tree, logits, params, gen, epsilon=-1.0)
    assert deep.path.numel() == tree.shape.max_depth + 1
    decoder = dh.SpeculativeDecoder(target, heads, tree=TREE)
    out = decoder.generate(prompt, max_new_tokens=8, temperature=1.0, acceptance="typical", seed=0, eos_token_id=[])
    assert out.num_new_tokens == 8
    with pytest.raises(ValueError, match="needs temperature > 0"):
        decoder.generate(prompt, max_new_tokens=4, acceptance="typical")
    with pytest.raises(ValueError, match="'exact' or 'block' or 'typical'"):
        decoder.generate(prompt, max_new_tokens=4, temperature=1.0, acceptance="fast")


# -- defaults: like `generate`, every unset setting comes from the target's generation config -----------
def generate_law(target, prompt) -> dict[tuple[int, ...], float]:
    """P(x1, ..., x_NEW | prompt) by the chain rule over the distributions that `target.generate`
    itself samples from with DEFAULT arguments: its processed scores (after its own warpers)."""

    def step(seq: tuple[int, ...]) -> torch.Tensor:
        ids = torch.cat([prompt, torch.tensor([seq], dtype=torch.long)], dim=1) if seq else prompt
        out = target.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, output_scores=True,
            return_dict_in_generate=True, pad_token_id=0,
        )
        return torch.softmax(out.scores[0][0].float(), dim=-1)

    law: dict[tuple[int, ...], float] = {}
    with torch.no_grad():
        firsts = step(())
        for a in range(VOCAB):
            seconds = step((a,))
            for b in range(VOCAB):
                thirds = step((a, b)) if float(firsts[a] * seconds[b]) > 0 else torch.zeros(VOCAB)
                for c in range(VOCAB):
                    law[(a, b, c)] = float(firsts[a] * seconds[b] * thirds[c])
    return law


def test_default_sampling_draws_what_generate_draws_by_default(setup):
    """A model whose generation config asks for sampling with its own temperature, top-k, top-p:
    `SpeculativeDecoder.generate` with no sampling arguments must draw what `generate` draws."""
    from transformers import GenerationConfig

    _, _, prompt = setup
    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    target.generation_config = GenerationConfig(
        do_sample=True, temperature=0.7, top_k=4, top_p=0.9, bos_token_id=1, eos_token_id=2, pad_token_id=0
    )
    law = generate_law(target, prompt)
    assert abs(sum(law.values()) - 1) < 1e-5
    assert sum(p == 0 for p in law.values()) > VOCAB**NEW // 2, "top-k/top-p should cut most sequences"
    decoder = dh.SpeculativeDecoder(target, dh.MedusaHeads.for_target(target, num_heads=2), tree=TREE)
    gen = torch.Generator().manual_seed(1234)
    counts: Counter = Counter()
    drafted = 0
    for _ in range(RUNS):
        out = decoder.generate(prompt, max_new_tokens=NEW, eos_token_id=[], generator=gen)
        counts[tuple(out.sequences[0, prompt.shape[1] :].tolist())] += 1
        drafted += max(out.accept_lengths, default=1) > 1
    pvalue = law_pvalue(counts, law)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: default sampling differs from generate's"
    assert drafted >= 50, "drafts were (almost) never accepted: the test would be vacuous"


def test_sampling_settings_resolve_like_generate():
    from transformers import GenerationConfig

    from draftheads.inference.sampling import resolve_sampling

    unset = GenerationConfig()
    assert resolve_sampling(unset).greedy  # generate's default: greedy
    assert resolve_sampling(None).greedy
    assert resolve_sampling(unset, do_sample=True) == SamplingParams(1.0, 50, 1.0)  # transformers' defaults
    assert resolve_sampling(unset, temperature=0.5) == SamplingParams(0.5, 50, 1.0)  # temperature > 0 samples
    assert resolve_sampling(unset, temperature=0.5, top_k=0) == SamplingParams(0.5, 0, 1.0)  # 0 = top-k off
    chat = GenerationConfig(do_sample=True, temperature=0.6, top_p=0.9)
    assert resolve_sampling(chat) == SamplingParams(0.6, 50, 0.9)
    assert resolve_sampling(chat, top_k=5, top_p=1.0) == SamplingParams(0.6, 5, 1.0)
    assert resolve_sampling(chat, temperature=0).greedy  # temperature 0 is always greedy
    assert resolve_sampling(chat, do_sample=False).greedy
    with pytest.raises(ValueError, match="do_sample=False contradicts temperature=0.5"):
        resolve_sampling(chat, do_sample=False, temperature=0.5)
    with pytest.raises(ValueError, match="do_sample=True contradicts temperature=0"):
        resolve_sampling(chat, do_sample=True, temperature=0)


def test_generation_settings_we_do_not_apply_are_named():
    from transformers import GenerationConfig

    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    target.generation_config = GenerationConfig(do_sample=True, repetition_penalty=1.05, min_p=0.1)
    with pytest.warns(UserWarning, match=r"repetition_penalty=1\.05, min_p=0\.1: SpeculativeDecoder applies only"):
        dh.SpeculativeDecoder(target, dh.MedusaHeads.for_target(target, num_heads=2))


@pytest.mark.parametrize("settings, match", [
    ({"temperature": -1.0}, "temperature must be >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": "0.7"}, "temperature must be a finite number, got '0.7'"),
    ({"top_k": -2, "temperature": 1.0}, "top_k must be >= 0"),
    ({"top_k": 2.5, "temperature": 1.0}, "top_k must be a whole number"),
    ({"top_p": float("nan"), "temperature": 1.0}, "top_p must be a finite number"),
    ({"top_p": 0.0, "temperature": 0}, r"top_p must be in \(0, 1\]"),  # refused even when greedy would ignore it
])
def test_sampling_values_generate_refuses_are_refused(setup, settings, match):
    """A negative or NaN temperature used to decode greedily without a word (NaN > 0 is False)."""
    from draftheads.inference.sampling import resolve_sampling

    with pytest.raises(ValueError, match=match):
        resolve_sampling(None, **settings)
    target, heads, prompt = setup
    with pytest.raises(ValueError, match=match):  # the API goes through the same check
        dh.SpeculativeDecoder(target, heads).generate(prompt, max_new_tokens=2, **settings)


def test_seed_and_generator_together_are_refused(setup):
    target, heads, prompt = setup
    decoder = dh.SpeculativeDecoder(target, heads)
    with pytest.raises(ValueError, match="seed= or generator=, not both"):
        decoder.generate(prompt, max_new_tokens=4, temperature=1.0, seed=1, generator=torch.Generator().manual_seed(2))
    a = decoder.generate(prompt, max_new_tokens=6, temperature=1.0, seed=5).sequences
    b = decoder.generate(prompt, max_new_tokens=6, temperature=1.0, generator=torch.Generator().manual_seed(5)).sequences
    assert torch.equal(a, b)  # seed=N is generator=Generator().manual_seed(N)
