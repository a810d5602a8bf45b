"""cache="static" (and compile) decode exactly what `generate` decodes: Medusa heads, EAGLE heads and
prompt lookup, on several architectures (windowed and chunked layers included), across calls that
reuse the cache, and when the cache has to grow; bad input gets a clear error."""
from __future__ import annotations

import pytest
import torch
from inference_utils import greedy_reference, self_distilled_heads, tiny_target
from stats import law_pvalue
from transformers import DynamicCache

import draftheads as dh
from draftheads.inference import PromptLookupProposer, TreeShape
from draftheads.inference.kv import static as static_cache
from draftheads.inference import decoder as decoder_module
from draftheads.inference.sampling import SamplingParams
from draftheads.inference.kv.static import StaticTreeVerifier
from draftheads.inference.tree import Tree
from draftheads.inference.accepted import Acceptance

# Prompt lengths 6 (the heads' training prompts) and a longer, repetitive one (> the 24-token
# sliding window and the 16-token chunks of inference_utils.ARCHS, so their masks matter, and
# prompt lookup finds n-grams).
NEW = (40, 40, 7, 1)


def _check_greedy(target, decoder, prompts) -> list[int]:
    """Every prompt with every budget through ONE decoder (the cache is reused, longest first and
    shorter after, so stale entries of earlier calls sit in the masked part)."""
    lengths = []
    for ids in prompts:
        for new in NEW:
            out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
            ref = greedy_reference(target, ids, new)
            assert torch.equal(out.sequences, ref), f"differs from generate (prompt {ids.shape[1]} tokens, {new} new)"
            lengths += out.accept_lengths
    return lengths


def _prompts(train_prompts):
    repeat = torch.tensor([[5, 9, 33, 17, 8, 5, 9, 33, 17, 8, 11, 12, 5, 9, 33, 17, 8, 40, 41, 42, 5, 9, 33, 17, 8, 3,
                            4, 5, 9, 33]])
    return [repeat, train_prompts[:1], train_prompts[1:2]]


@pytest.fixture(scope="module", params=["llama", "qwen2", "mistral", "gemma3_text", "llama4_text"])
def medusa_setup(request):
    target = tiny_target(request.param)
    heads, train_prompts = self_distilled_heads(target)
    return target, heads, train_prompts


def test_static_cache_greedy_medusa_matches_generate(medusa_setup):
    target, heads, train_prompts = medusa_setup
    decoder = dh.SpeculativeDecoder(target, heads, cache="static")
    assert isinstance(decoder.verifier, StaticTreeVerifier)
    lengths = _check_greedy(target, decoder, _prompts(train_prompts))
    assert sum(lengths) / len(lengths) > 1.5, "drafts barely accepted: the commit paths would not be exercised"


def _recording(fn, record):
    def wrapped(*args):
        record(*args)
        return fn(*args)

    return wrapped


def test_padded_trees_match_generate(medusa_setup):
    """What compile does to shapes, without compiling: truncated Medusa trees padded to the full
    tree, prompt-lookup chains to powers of two; padding rows must change nothing."""
    target, heads, train_prompts = medusa_setup
    for proposer in (heads, PromptLookupProposer()):
        decoder = dh.SpeculativeDecoder(target, proposer, cache="static")
        decoder.verifier.pad_trees = True
        sizes, padded = [], []
        decoder.verifier.forward_tree = _recording(decoder.verifier.forward_tree, lambda cache, tree, prefix: sizes.append(tree.shape.size))
        decoder.verifier._step = _recording(decoder.verifier._step, lambda ids, *rest: padded.append(ids.shape[1]))
        _check_greedy(target, decoder, _prompts(train_prompts)[:2])
        allowed = {decoder.proposer.shape.size} if proposer is heads else {1, 2, 4, 8, 16}
        assert set(padded) <= allowed, sorted(set(padded))
        assert any(p > n for p, n in zip(padded, sizes)), "no tree was padded: the test would be vacuous"


def test_static_cache_greedy_prompt_lookup_matches_generate(medusa_setup):
    target, _, train_prompts = medusa_setup
    decoder = dh.SpeculativeDecoder(target, PromptLookupProposer(), cache="static")
    lengths = _check_greedy(target, decoder, _prompts(train_prompts))
    assert max(lengths) > 1, "prompt lookup never accepted a draft: the test would be vacuous"


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_static_cache_greedy_eagle_matches_generate(arch):
    from test_head_types import trained_heads

    target = tiny_target(arch)
    heads, train_prompts = trained_heads(target, "eagle")
    decoder = dh.SpeculativeDecoder(target, heads, cache="static")
    lengths = _check_greedy(target, decoder, _prompts(train_prompts)[1:])
    assert sum(lengths) / len(lengths) > 1.5


def test_static_commit_moves_the_accepted_branch():
    """A non-contiguous path (root -> second child -> its child) lands in slots prefix..prefix+2,
    equal to a plain prefill of the accepted tokens; the slots' old contents are overwritten."""
    target = tiny_target("llama")
    verifier = StaticTreeVerifier(target, feature_layers=())
    shape = TreeShape.from_choices([[0], [1], [1, 0]])
    tokens, prompt = torch.tensor([5, 6, 7, 8]), torch.tensor([[3, 4, 9]])
    with torch.no_grad():
        prefill = DynamicCache()
        target(prompt, use_cache=True, **{verifier.cache_arg: prefill})
        cache = verifier.store.load(prefill, 3, 16)
        verifier.forward(cache, Tree(shape, tokens), 3)
        verifier.store.commit(3, Acceptance(torch.tensor([0, 2, 3]), -1))  # tokens 5, 7, 8
        ref = DynamicCache()
        target(torch.tensor([[3, 4, 9, 5, 7, 8]]), use_cache=True, **{verifier.cache_arg: ref})
    for got, want in zip(verifier.store.cache.layers, ref.layers):
        assert int(got.cumulative_length) == 6
        torch.testing.assert_close(got.keys[:, :, :6], want.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values[:, :, :6], want.values, atol=1e-5, rtol=1e-5)


def test_static_cache_grows_when_a_call_or_a_tree_needs_more(monkeypatch):
    """Cache lengths in buckets of 1 and no tree headroom: the first call allocates exactly prompt +
    max_new_tokens, a wider tree then forces growth mid-generation, a longer call grows it again."""
    target = tiny_target("llama")
    heads, train_prompts = self_distilled_heads(target)
    monkeypatch.setattr(static_cache, "BUCKET", 1)
    monkeypatch.setattr(decoder_module, "tree_headroom", lambda proposer: 0)
    decoder = dh.SpeculativeDecoder(target, heads, cache="static")
    store = decoder.verifier.store
    grown = []
    ensure = store.ensure
    monkeypatch.setattr(store, "ensure", lambda needed, prefix: (grown.append(needed > store.capacity), ensure(needed, prefix)))
    ids = train_prompts[:1]
    for new in (10, 40):
        out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, new))
    assert any(grown), "no tree ever needed more than prompt + max_new_tokens: growth untested"
    assert store.capacity >= ids.shape[1] + 40


def test_static_cache_bad_input_is_refused():
    target = tiny_target("llama")
    with pytest.raises(ValueError, match="cache must be one of"):
        dh.SpeculativeDecoder(target, PromptLookupProposer(), cache="paged")
    with pytest.raises(ValueError, match="need cache='static'"):
        dh.SpeculativeDecoder(target, PromptLookupProposer(), compile=True)
    with pytest.raises(ValueError, match="max_cache_len must be >= 1"):
        dh.SpeculativeDecoder(target, PromptLookupProposer(), cache="static", max_cache_len=0)
    with pytest.raises(ValueError, match="max_cache_len must be a whole number"):
        dh.SpeculativeDecoder(target, PromptLookupProposer(), cache="static", max_cache_len=32.5)
    decoder = dh.SpeculativeDecoder(target, PromptLookupProposer(), cache="static", max_cache_len=32)
    ids = torch.tensor([[5, 9, 33, 17, 8, 5]])
    with pytest.raises(ValueError, match=r"max_cache_len=32"):
        decoder.generate(ids, max_new_tokens=40)
    assert decoder.generate(ids, max_new_tokens=10, eos_token_id=[]).sequences.shape[1] == 16  # fits: decodes
    batch = torch.tensor([[5, 9, 33], [4, 8, 7]])
    with pytest.raises(ValueError, match="one sequence at a time"):
        decoder.generate(batch, attention_mask=torch.ones_like(batch), max_new_tokens=4)


def test_static_cache_samples_the_target_distribution():
    from test_sampling import NEW as SAMPLED
    from test_sampling import TREE, VOCAB, drafts_accepted, empirical_counts, exact_distribution

    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    torch.manual_seed(0)
    heads = dh.MedusaHeads.for_target(target, num_heads=SAMPLED - 1, num_layers=1)
    decoder = dh.SpeculativeDecoder(target, heads, tree=TREE, cache="static")
    prompt = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    pvalue = law_pvalue(empirical_counts(decoder, prompt, params), exact_distribution(target, prompt, params))
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: not the target's distribution"
    assert drafts_accepted(decoder, prompt, params) >= 5


@pytest.mark.parametrize("backend", ["eager"])  # inductor compiles for minutes on a CPU: benchmarks/gpu.sh
def test_compiled_verify_forward_matches_generate(backend):
    """compile: the verify forward goes through torch.compile (graphs counted by dynamo) and the
    output is still `generate`'s. Backend "eager" (dynamo's graph capture, no code generation): the
    same graphs inductor would compile, at a cost CI can pay; inductor itself is exercised by
    benchmarks/gpu.sh (its static_cache section)."""
    import torch._dynamo

    target = tiny_target("llama")
    torch._dynamo.reset()
    decoder = dh.SpeculativeDecoder(target, PromptLookupProposer(num_tokens=2), cache="static", compile=backend)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    ids = torch.tensor([[5, 9, 33, 17, 8, 5, 9, 33, 17, 8, 11, 12, 5, 9, 33]])
    out = decoder.generate(ids, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 12))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > frames, "the verify forward was not compiled"
