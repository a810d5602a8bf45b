"""Exactness of tree verification against transformers' own forward and generate."""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import draftheads as dh
from draftheads.inference import TreeShape, TreeVerifier, commit
from draftheads.inference.tree import Tree

from inference_utils import ARCHS, VOCAB, greedy_reference, self_distilled_heads, tiny_target


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_setup(request):
    target = tiny_target(request.param)
    heads, train_prompts = self_distilled_heads(target)
    return request.param, target, heads, train_prompts


# -- tree topology ---------------------------------------------------------------------------------
def test_tree_from_choices_topology():
    shape = TreeShape.from_choices([[1], [0], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    # sorted by (depth, ranks): root, [0], [1], [0,0], [0,1], [1,0], [0,0,0]
    assert shape.parents == (-1, 0, 0, 1, 1, 2, 3)
    assert shape.ranks == (-1, 0, 1, 0, 1, 0, 0)
    assert shape.depth.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert shape.children[1] == (3, 4)
    mask = shape.ancestor_mask
    assert mask[6].nonzero().flatten().tolist() == [0, 1, 3, 6]
    assert not mask[4, 3] and not mask[2, 1]
    assert sorted(map(tuple, shape.paths.tolist())) == sorted([(0, 1, 3, 6), (0, 1, 4, -1), (0, 2, 5, -1)])
    short = shape.truncated(1)
    assert short.parents == (-1, 0, 0) and short.ranks == (-1, 0, 1)


def test_tree_rejects_disconnected_paths():
    with pytest.raises(ValueError, match="no parent path"):
        TreeShape.from_choices([[0], [1, 0]])
    with pytest.raises(ValueError, match="parents must come before"):
        TreeShape((-1, 2, 0))


# -- one forward over a tree == plain forwards over each root-to-node path --------------------------
@pytest.mark.parametrize("arch", list(ARCHS))
def test_tree_forward_matches_path_forwards(arch):
    target = tiny_target(arch)
    gen = torch.Generator().manual_seed(0)
    shape = TreeShape.from_choices([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]])
    tokens = torch.randint(3, VOCAB, (shape.size,), generator=gen)
    # A prompt longer than the sliding windows, so windowed masks matter.
    prompt = torch.randint(3, VOCAB, (1, 30), generator=gen)
    verifier = TreeVerifier(target)
    with torch.no_grad():
        cache = DynamicCache()
        target(prompt, use_cache=True, **{verifier.cache_arg: cache})
        logits, hidden = verifier.forward(cache, Tree(shape, tokens), prompt.shape[1])
        for node in range(shape.size):
            path = shape.ancestor_mask[node].nonzero().flatten()
            ref = target(torch.cat([prompt, tokens[path][None]], dim=1), output_hidden_states=True)
            torch.testing.assert_close(logits[node], ref.logits[0, -1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(hidden[node], ref.hidden_states[-1][0, -1], atol=1e-5, rtol=1e-5)


def test_commit_keeps_prefix_and_accepted_path():
    target = tiny_target("llama")
    verifier = TreeVerifier(target)
    shape = TreeShape.from_choices([[0], [1], [1, 0]])
    tokens = torch.tensor([5, 6, 7, 8])
    prompt = torch.tensor([[3, 4, 9]])
    with torch.no_grad():
        cache = DynamicCache()
        target(prompt, use_cache=True, **{verifier.cache_arg: cache})
        verifier.forward(cache, Tree(shape, tokens), 3)
        commit(cache, 3, torch.tensor([0, 2, 3]))  # root -> [1] -> [1, 0]: tokens 5, 7, 8
        ref_cache = DynamicCache()
        target(torch.tensor([[3, 4, 9, 5, 7, 8]]), use_cache=True, **{verifier.cache_arg: ref_cache})
    for got, ref in zip(cache.layers, ref_cache.layers):
        torch.testing.assert_close(got.keys, ref.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.values, ref.values, atol=1e-5, rtol=1e-5)


# -- greedy decoding == target.generate(do_sample=False) ----------------------------------------------
def test_greedy_matches_generate(arch_setup):
    arch, target, heads, train_prompts = arch_setup
    decoder = dh.SpeculativeDecoder(target, heads)
    gen = torch.Generator().manual_seed(7)
    fresh = [torch.randint(3, VOCAB, (1, n), generator=gen) for n in (1, 4, 9)]
    seen = [train_prompts[i : i + 1] for i in range(4)]
    accepted_on_seen = []
    for i, ids in enumerate(seen + fresh):
        for max_new in (1, 2, 7, 40):
            out = decoder.generate(ids, max_new_tokens=max_new, eos_token_id=[])
            ref = greedy_reference(target, ids, max_new)
            assert torch.equal(out.sequences, ref), f"{arch} prompt {i} max_new_tokens={max_new}"
            assert out.num_new_tokens == max_new
            if i < len(seen) and max_new == 40:
                accepted_on_seen += out.accept_lengths
    mean = sum(accepted_on_seen) / len(accepted_on_seen)
    assert mean > 1.3, f"{arch}: drafts were rarely accepted (mean {mean:.2f}), the test would prove little"


def test_greedy_stops_at_eos_like_generate(arch_setup):
    arch, target, heads, train_prompts = arch_setup
    decoder = dh.SpeculativeDecoder(target, heads)
    ids = train_prompts[:1]
    free = greedy_reference(target, ids, 30)[0, ids.shape[1] :]
    for pos in (0, 1, 5, 12):  # EOS as the first token, mid-step, and later
        eos = int(free[pos])
        out = decoder.generate(ids, max_new_tokens=30, eos_token_id=eos)
        ref = greedy_reference(target, ids, 30, eos=eos)
        assert torch.equal(out.sequences, ref), f"{arch}: eos {eos} at {pos}"
        assert int(out.sequences[0, -1]) == eos


def test_stream_receives_exactly_the_output(arch_setup):
    _, target, heads, train_prompts = arch_setup

    class Recorder:
        def __init__(self):
            self.chunks, self.ended = [], False

        def put(self, value):
            self.chunks.append(value.tolist())

        def end(self):
            self.ended = True

    rec = Recorder()
    ids = train_prompts[1:2]
    out = dh.SpeculativeDecoder(target, heads).generate(ids, max_new_tokens=17, streamer=rec, eos_token_id=[])
    assert rec.chunks[0] == ids[0].tolist() and rec.ended
    assert sum(rec.chunks[1:], []) == out.sequences[0, ids.shape[1] :].tolist()


def test_restricted_draft_vocab_drafts_only_frequent_tokens_and_stays_exact(arch_setup):
    arch, target, heads, train_prompts = arch_setup
    ids = train_prompts[2:3]
    ref = greedy_reference(target, ids, 30)
    counts = torch.bincount(ref[0], minlength=VOCAB)
    if int((counts > 0).sum()) >= 3:  # one rare token the heads will never be able to draft
        counts[torch.where(counts > 0, counts, counts.max() + 1).argmin()] = 0
    heads.token_counts.copy_(counts)
    try:
        proposer = dh.MedusaDrafter(heads, draft_vocab_size=int((counts > 0).sum()))
        allowed = set(proposer.vocab_ids.tolist())
        assert allowed == set(counts.nonzero().flatten().tolist())
        decoder = dh.SpeculativeDecoder(target, proposer)
        drafted = []
        original = proposer.propose
        proposer.propose = lambda roots, depths: drafted.extend(trees := original(roots, depths)) or trees
        out = decoder.generate(ids, max_new_tokens=30, eos_token_id=[])
        assert torch.equal(out.sequences, ref), arch
        assert drafted and all(set(t.tokens[1:].tolist()) <= allowed for t in drafted)
        assert out.mean_accept_length > 1.3
    finally:
        heads.token_counts.zero_()


# -- bad input ---------------------------------------------------------------------------------------
def test_bad_inputs_are_refused_with_clear_errors():
    target = tiny_target("llama")
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    decoder = dh.SpeculativeDecoder(target, heads)
    # Batches decode (tests/test_batch.py); a batch whose mask does not fit it is refused.
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 2\) but input_ids has shape \(2, 3\)"):
        decoder.generate(torch.ones(2, 3, dtype=torch.long), attention_mask=torch.ones(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="prompt is empty"):
        decoder.generate(torch.ones(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the model's context of 256"):
        decoder.generate(torch.ones(1, 10, dtype=torch.long), max_new_tokens=250)
    with pytest.raises(ValueError, match="tree is 3 deep but the heads have only 2"):
        dh.SpeculativeDecoder(target, heads, tree=[[0], [0, 0], [0, 0, 0]])
    other = tiny_target("llama", seed=1)
    with pytest.raises(ValueError, match="LM head weights differ"):
        dh.SpeculativeDecoder(other, heads)
    qwen = tiny_target("qwen2", hidden=32)
    with pytest.raises(ValueError, match="hidden_size"):
        dh.SpeculativeDecoder(qwen, heads)


def test_model_ignoring_4d_masks_is_refused():
    target = tiny_target("llama")
    original_forward = target.forward

    def forward_that_drops_masks(*args, attention_mask=None, **kwargs):
        return original_forward(*args, **kwargs)  # builds its own causal mask: siblings see each other

    target.forward = forward_that_drops_masks
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    with pytest.raises(dh.UnsupportedModelError, match="does not honour a custom 4D attention mask"):
        dh.SpeculativeDecoder(target, heads)


def test_mask_wrong_only_far_into_a_sequence_is_refused():
    """A model that honours the tree mask for short prefixes but not past position 100 (as a model
    with an undeclared window or chunking would) must fail the probe, not decode wrongly."""
    target = tiny_target("llama")
    original_forward = target.forward

    def forward_wrong_past_100(*args, attention_mask=None, position_ids=None, **kwargs):
        if isinstance(attention_mask, torch.Tensor) and position_ids is not None and int(position_ids.max()) >= 100:
            attention_mask = torch.zeros_like(attention_mask)  # every node sees every other: siblings too
        return original_forward(*args, attention_mask=attention_mask, position_ids=position_ids, **kwargs)

    target.forward = forward_wrong_past_100
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    with pytest.raises(dh.UnsupportedModelError, match=r"after a \d+-token prefix \(correct after 4 tokens"):
        dh.SpeculativeDecoder(target, heads)


def test_probe_catches_a_chunked_model_decoded_with_full_attention_masks():
    """The original bug: Llama 4's chunked layers given a plain tree mask. Chains and short
    prefixes agree; the probe must look past the chunk size and refuse."""
    target = tiny_target("llama4_text")
    verifier = TreeVerifier(target)
    assert verifier.spans["chunked_attention"].chunk == 16
    dh.inference.check_tree_attention(target, verifier)  # the real masks pass
    verifier.spans = {name: dh.inference.masks.AttentionSpan() for name in verifier.spans}
    with pytest.raises(dh.UnsupportedModelError, match="after a 15-token prefix"):
        dh.inference.check_tree_attention(target, verifier)


def test_a_layer_type_that_is_neither_attention_nor_a_known_state_is_refused_by_name():
    """Hybrid targets decode (tests/test_hybrid_targets.py); a layer type nothing here can verify a draft
    through is refused, naming it, before any decode."""
    target = tiny_target("llama")
    target.config.layer_types = ["full_attention", "mystery_mixer"]
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    with pytest.raises(dh.UnsupportedModelError, match=r"model_type 'llama'\) has layers of type \['mystery_mixer'\]"):
        dh.SpeculativeDecoder(target, heads, check_model=False)  # refused even without the probe


def test_model_failing_in_the_probe_prefill_is_refused():
    target = tiny_target("llama")
    original_forward = target.forward

    def forward_without_4d_support(*args, **kwargs):
        if kwargs.get("position_ids") is None:
            raise IndexError("list index out of range")  # as hybrid caches fail on a plain DynamicCache
        return original_forward(*args, **kwargs)

    target.forward = forward_without_4d_support
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    with pytest.raises(dh.UnsupportedModelError, match="failed on a prefill .*IndexError"):
        dh.SpeculativeDecoder(target, heads)


def test_probe_looks_around_every_window_and_chunk_the_model_uses():
    from draftheads.inference.probe import PROBE_PREFIX, probe_prefix_lengths

    assert probe_prefix_lengths(tiny_target("llama", max_position_embeddings=4096)) == [4, PROBE_PREFIX]
    assert probe_prefix_lengths(tiny_target("mistral")) == [4, 23, 26, 254]  # window 24; clipped to the context
    assert probe_prefix_lengths(tiny_target("llama4_text")) == [4, 15, 18, 254]  # chunk 16
    # Qwen2 declares a window it does not use: probing there would be a pointless 4k-token prefill.
    unused = tiny_target("qwen2", sliding_window=4096, max_position_embeddings=32768)
    assert probe_prefix_lengths(unused) == [4, PROBE_PREFIX]
