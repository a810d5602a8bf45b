"""Drawn drafts, the default when a request samples: every head type draws a chain from its own
law (`inference.proposers.sampled`), EAGLE heads a tree of siblings drawn without replacement
(`inference.proposers.drawn_trees`), and the output is still exactly the target's law.

Each generation makes 4 new tokens: the first comes from the prefill, so the first speculative
step drafts 2 deep (EAGLE's draft layer then runs on the drawn token, Hydra's head on the drawn
path) and the law of the first 3 tokens is tested against the exact chain-rule law. A verifier
told the wrong draft law must fail the same test.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import draftheads as dh
import draftheads.inference.loop as loop
import draftheads.methods.medusa.drafter as medusa_proposer
from draftheads.methods.dflash.heads import DFlashHeads
from draftheads.inference.sampling import SamplingParams

from inference_utils import tiny_target
from stats import law_pvalue
from test_sampling import exact_distribution

VOCAB = 6
TREE = [[0], [1], [0, 0], [0, 1], [1, 0]]  # two deep: the drawn chain is two deep too
RUNS = 2500
PARAMS = SamplingParams(temperature=0.9, top_k=5)


def _eagle3(target):
    heads = dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=5)
    heads.set_draft_vocab(torch.tensor([1, 5, 4, 3, 2, 6]))
    return heads


def _peagle(target):
    heads = dh.PEagleHead.for_target(target, num_heads=2, draft_vocab_size=5, mask_token_id=0)
    heads.set_draft_vocab(torch.tensor([0, 5, 4, 3, 2, 6]))  # the mask token is never drafted
    return heads


def _dspark(target):
    heads = dh.DSparkHeads.for_target(target, num_layers=1, block_size=2, mask_token_id=5, markov_rank=3)
    with torch.no_grad():  # a Markov bias that changes each depth's law with the token drawn before it
        heads.markov_head.markov_w2.weight.normal_(0.0, 1.0)
    return heads


def _dflash2(target):
    heads = dh.DFlash2Heads.for_target(target, num_layers=1, block_size=3, mask_token_id=5, selector_rank=4,
                                       selector_top_k=4, conv_group_size=8)
    with torch.no_grad():  # a selector whose scores depend on the token drawn before
        for p in (heads.candidate_selector.predecessor_codebook, heads.candidate_selector.successor_codebook,
                  heads.candidate_selector.hidden_projection.weight):
            p.normal_(0.0, 1.0)
    return heads


HEADS = {
    "medusa": (lambda t: dh.MedusaHeads.for_target(t, num_heads=2), TREE),
    "hydra": (lambda t: dh.HydraHeads.for_target(t, num_heads=2), TREE),
    # depth 5: a drawn tree verifies depth + 1 tokens at most (a drawn chain's), here all 6; 4-token
    # generations cut it to 2 deep
    "eagle": (lambda t: dh.EagleHead.for_target(t, num_heads=1), {"total_tokens": 6, "depth": 5, "top_k": 2}),
    "eagle3": (_eagle3, {"total_tokens": 6, "depth": 5, "top_k": 2}),
    "peagle": (_peagle, TREE),
    "dflash": (lambda t: DFlashHeads.for_target(t, num_layers=1, block_size=3, mask_token_id=5), TREE),
    "dspark": (_dspark, TREE),
    "dflash2": (_dflash2, TREE),
}


@pytest.fixture(scope="module")
def target():
    model = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=2)  # DFlash reads a layer below the last
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def decoder_for(target, head_type: str, **options) -> dh.SpeculativeDecoder:
    build, tree = HEADS[head_type]
    torch.manual_seed(0)
    return dh.SpeculativeDecoder(target, build(target), tree=tree, **options)


def first_three_counts(decoder, prompt, runs: int = RUNS) -> tuple[Counter, int]:
    """The first 3 of 4 sampled tokens over ``runs`` seeded generations, and how many of them
    accepted a drafted token at depth 2 (a step committing 3 tokens)."""
    gen = torch.Generator().manual_seed(1234)
    counts: Counter = Counter()
    deep = 0
    for _ in range(runs):
        out = decoder.generate(prompt, max_new_tokens=4, temperature=PARAMS.temperature, top_k=PARAMS.top_k,
                               eos_token_id=[], generator=gen)
        counts[tuple(out.sequences[0, prompt.shape[1]: prompt.shape[1] + 3].tolist())] += 1
        deep += max(out.accept_lengths) >= 3
    return counts, deep


@pytest.fixture
def drafted_trees(monkeypatch):
    """Every tree the loop verifies, recorded on its way to acceptance."""
    seen = []
    accept = loop.accept_rows

    def recording(trees, *args, **kwargs):
        seen.extend(trees)
        return accept(trees, *args, **kwargs)

    monkeypatch.setattr(loop, "accept_rows", recording)
    return seen


#: The head types whose dynamic trees are drawn as trees (the rest draw chains).
DRAWS_TREES = {"eagle", "eagle3"}


def check_drawn(tree) -> None:
    """Every law sums to one and has mass on its draft; siblings are drawn without replacement: a
    sibling's law has no mass on an earlier sibling's token, and it differs from theirs unless its
    law is a point mass on the one before (no mass was left)."""
    laws, drawn = tree.draft_probs[1:].cpu(), tree.tokens[1:].cpu()
    assert torch.allclose(laws.sum(-1), torch.ones(laws.shape[0]), atol=1e-5)
    assert bool((laws[torch.arange(drawn.numel()), drawn] > 0).all()), "a draft drawn where its law is 0"
    tokens, probs = tree.tokens.tolist(), tree.draft_probs.cpu()
    for kids in tree.shape.children:
        for j, child in enumerate(kids):
            earlier = [tokens[k] for k in kids[:j]]
            if earlier and float(probs[child].max()) == 1.0 and tokens[child] == earlier[-1]:
                continue  # no mass left: a point mass the verifier rejects
            assert tokens[child] not in earlier, "siblings drawn with replacement"
            assert all(float(probs[child, t]) == 0.0 for t in earlier), "a sibling's law keeps an earlier one's token"


@pytest.mark.parametrize("head_type", list(HEADS))
def test_drawn_drafts_keep_the_target_distribution(target, head_type, drafted_trees):
    decoder = decoder_for(target, head_type)
    prompt = torch.tensor([[1, 4, 3]])
    counts, deep = first_three_counts(decoder, prompt)
    pvalue = law_pvalue(counts, exact_distribution(target, prompt, PARAMS))
    assert pvalue > 1e-3, f"{head_type}: chi-square p-value {pvalue:.2g}: not the target's distribution"
    assert deep >= 25, f"{head_type}: a depth-2 draft was accepted in only {deep}/{RUNS} runs: the test would be vacuous"
    drafted = [t for t in drafted_trees if t.shape.size > 1]
    assert drafted and all(t.draft_probs is not None for t in drafted), "sampling did not draw its drafts"
    chains = [t.shape.parents == tuple(range(-1, t.shape.size - 1)) for t in drafted]
    if head_type in DRAWS_TREES:
        assert not all(chains), "EAGLE heads drew only chains"
    else:
        assert all(chains), "a drawn draft of these heads is a chain"
    for tree in drafted[:50]:
        check_drawn(tree)


def test_a_verifier_told_the_wrong_draft_law_is_caught(target, monkeypatch):
    """The test above has teeth: Medusa draws from q but tells the verifier the uniform law."""
    draw = medusa_proposer.draw

    def misreported(logits, params, generator, vocab_ids=None, vocab_size=None):
        tokens, law = draw(logits, params, generator, vocab_ids, vocab_size)
        return tokens, torch.full_like(law, 1.0 / law.shape[-1])

    monkeypatch.setattr(medusa_proposer, "draw", misreported)
    prompt = torch.tensor([[1, 4, 3]])
    counts, _ = first_three_counts(decoder_for(target, "medusa"), prompt)
    pvalue = law_pvalue(counts, exact_distribution(target, prompt, PARAMS))
    assert pvalue < 1e-3, f"a misreported draft law went unnoticed (chi-square p-value {pvalue:.2g})"


@pytest.mark.parametrize("head_type", ["medusa", "eagle"])
def test_top_k_trees_stay_available_and_greedy_is_unchanged(target, head_type, drafted_trees):
    prompt = torch.tensor([[1, 4, 3]])
    top_k = decoder_for(target, head_type, draw_drafts=False)
    top_k.generate(prompt, max_new_tokens=6, temperature=0.9, eos_token_id=[], seed=0)
    assert all(t.draft_probs is None for t in drafted_trees), "draw_drafts=False drew its drafts"
    drafted_trees.clear()
    drawn = decoder_for(target, head_type).generate(prompt, max_new_tokens=6, temperature=0, eos_token_id=[])
    plain = target.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(drawn.sequences, plain), "greedy decoding changed"
    assert all(t.draft_probs is None for t in drafted_trees), "greedy decoding drew drafts"


def test_draw_drafts_must_be_a_bool(target):
    with pytest.raises(ValueError, match="draw_drafts must be True or False"):
        decoder_for(target, "medusa", draw_drafts="yes")
