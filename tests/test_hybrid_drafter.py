"""Prompt lookup in front of heads (`SpeculativeDecoder(..., prompt_lookup=True)`): rows whose
text repeats draft the copy, the others draft with the heads; greedy output is `generate`'s on two
architectures, single rows and a left-padded batch, and sampling keeps the target's law."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import draftheads as dh
from draftheads.inference.proposers.hybrid import LookupThenHeads
from draftheads.inference.sampling import SamplingParams

from inference_utils import greedy_reference, tiny_target
from stats import law_pvalue
from test_batch import left_padded, reference
from test_sampling import exact_distribution

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EAGLE_TREE = {"total_tokens": 4, "depth": 2, "top_k": 2}


def eagle3_heads(target) -> torch.nn.Module:
    torch.manual_seed(0)
    heads = dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=32)
    heads.set_draft_vocab(torch.arange(64).flip(0))  # a draft vocabulary of ids 0-31
    return heads


def medusa_heads(target) -> torch.nn.Module:
    torch.manual_seed(0)
    return dh.MedusaHeads.for_target(target, num_heads=2)


HEADS = {"eagle3": (eagle3_heads, EAGLE_TREE), "medusa": (medusa_heads, [[0], [1], [0, 0]])}


def prompts() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    phrase = torch.randint(4, 64, (6,), generator=g)
    return [torch.randint(4, 64, (1, 9), generator=g), torch.cat([phrase, phrase, phrase[:2]])[None]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("head_type", list(HEADS))
def test_lookup_then_heads_greedy_equals_generate(arch, head_type):
    target = tiny_target(arch, seed=1, vocab=64, hidden=32, layers=2)
    build, tree = HEADS[head_type]
    decoder = dh.SpeculativeDecoder(target, build(target), tree=tree, prompt_lookup=True)
    assert isinstance(decoder.proposer, LookupThenHeads)
    drafted = Counter()
    for ids in prompts():
        for new in (1, 5, 40):
            out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
            ref = greedy_reference(target, ids, new)
            assert out.sequences.tolist() == ref.tolist(), (head_type, arch, ids.tolist(), new)
            drafted.update(out.stats["drafted_by"])
    # Both sources drafted, so both paths (and their hand-over) were checked.
    assert drafted["lookup"] > 0 and drafted["heads"] > 0, drafted


def test_lookup_then_heads_batch_rows_equal_generate():
    target = tiny_target("llama", seed=2, vocab=64, hidden=32, layers=2)
    rows = [p[0].tolist() for p in prompts()] + [[1, 20, 33, 40, 5], [7, 8, 9, 7, 8, 9, 7]]
    ids, mask = left_padded(rows)
    decoder = dh.SpeculativeDecoder(target, eagle3_heads(target), tree=EAGLE_TREE, prompt_lookup=True)
    out = decoder.generate(ids, attention_mask=mask, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out.sequences, reference(target, ids, mask, new=24))


VOCAB = 6
PARAMS = SamplingParams(temperature=0.9, top_k=5)


def test_lookup_then_heads_samples_the_target_distribution():
    """Rows that drafted the copy and rows the heads drafted (drawn chains) both go through the
    verifier in one run; the first three sampled tokens follow the exact chain-rule law."""
    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    decoder = dh.SpeculativeDecoder(target, medusa_heads(target), tree=[[0], [1], [0, 0]], prompt_lookup=True)
    prompt = torch.tensor([[1, 4, 3, 1, 4, 3]])  # the root 1 after 3 matches the bigram (3, 1): a copy
    gen = torch.Generator().manual_seed(1234)
    counts, sources = Counter(), Counter()
    for _ in range(2500):
        out = decoder.generate(prompt, max_new_tokens=4, temperature=PARAMS.temperature, top_k=PARAMS.top_k,
                               eos_token_id=[], generator=gen)
        counts[tuple(out.sequences[0, prompt.shape[1]: prompt.shape[1] + 3].tolist())] += 1
        sources.update(out.stats["drafted_by"])
    pvalue = law_pvalue(counts, exact_distribution(target, prompt, PARAMS))
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: not the target's distribution"
    assert sources["lookup"] >= 100 and sources["heads"] >= 100, sources


def test_lookup_then_heads_bad_settings_are_named():
    target = tiny_target("llama", seed=1, vocab=64, hidden=32, layers=2)
    heads = medusa_heads(target)
    with pytest.raises(ValueError, match="prompt_lookup must be None .*, True, False or a PromptLookupProposer"):
        dh.SpeculativeDecoder(target, heads, prompt_lookup="yes")
    with pytest.raises(ValueError, match="prompt_lookup=... goes with heads"):
        dh.SpeculativeDecoder(target, dh.PromptLookupProposer(), prompt_lookup=True)
    drafter = heads.proposer(tree=[[0]])
    with pytest.raises(TypeError, match="lookup must be a PromptLookupProposer"):
        LookupThenHeads(drafter, drafter)
    # By default a match needs 2 tokens; a configured lookup is used as given (its own n-grams and length).
    default = dh.SpeculativeDecoder(target, heads, tree=[[0]], prompt_lookup=True).proposer.lookup.proposer
    assert (default.min_ngram, default.max_ngram) == (2, 3)
    decoder = dh.SpeculativeDecoder(target, heads, tree=[[0]],
                                    prompt_lookup=dh.PromptLookupProposer(max_ngram=4, min_ngram=1, num_tokens=3))
    lookup = decoder.proposer.lookup.proposer
    assert (lookup.min_ngram, lookup.max_ngram, lookup.num_tokens) == (1, 4, 3)


def test_a_one_token_match_drafts_the_copy_only_when_the_lookup_allows_it():
    """The hand-over rule: with min_ngram 2 a row whose last bigram is new drafts with the heads,
    even where its last token alone occurred before; with min_ngram 1 it drafts the copy."""
    target = tiny_target("llama", seed=1, vocab=64, hidden=32, layers=2)
    params = SamplingParams()
    for min_ngram, source in ((2, "heads"), (1, "lookup")):
        drafter = LookupThenHeads(medusa_heads(target).proposer(tree=[[0]]),
                                  dh.PromptLookupProposer(max_ngram=3, min_ngram=min_ngram))
        prompt = torch.tensor([5, 6, 7, 8])
        with torch.no_grad():
            hidden = target(prompt[None], output_hidden_states=True).hidden_states[-1][0]
        drafter.start([prompt], [hidden], params, None)
        (tree,) = drafter.propose([6], [3])  # (8, 6) never occurred; 6 did, followed by 7 8 6
        assert drafter.stats()["drafted_by"][source] == 1
        if source == "lookup":
            assert tree.tokens.tolist() == [6, 7, 8, 6]
