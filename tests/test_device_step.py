"""The decode step shaped for an accelerator: hidden states only where read, one host read of
device data per greedy step, tree masks extended on the device, vocabulary rows kept there."""
from __future__ import annotations

import pytest
import torch
from inference_utils import VOCAB, greedy_reference, select_features, self_distilled_heads, tiny_target
from transformers import DynamicCache

import draftheads as dh
from draftheads.inference.features import FeatureTap
from draftheads.inference.host_syncs import HostSyncCounter
from draftheads.inference.sampling import SamplingParams, sample_inverse_cdf
from draftheads.inference.tree import Tree, TreeShape
from draftheads.inference.accept import accept_greedy_rows, accept_sampling
from draftheads.inference.masks import tree_attention_mask
from draftheads.inference.verify import TreeVerifier


class ForwardSpy:
    """Records the keyword arguments of every target forward and what came back."""

    def __init__(self, target: torch.nn.Module) -> None:
        self.calls: list[dict] = []
        self.hidden_states: list = []
        original = target.forward

        def forward(*args, **kwargs):
            self.calls.append(dict(kwargs))
            out = original(*args, **kwargs)
            self.hidden_states.append(getattr(out, "hidden_states", None))
            return out

        target.forward = forward


def test_prompt_lookup_never_materialises_the_hidden_states():
    target = tiny_target("llama", layers=3)
    decoder = dh.SpeculativeDecoder(target, dh.PromptLookupProposer(num_tokens=4))
    assert decoder.verifier.feature_layers == ()
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    reference = greedy_reference(target, ids, 12)
    spy = ForwardSpy(target)
    out = decoder.generate(ids, max_new_tokens=12, eos_token_id=[])
    assert torch.equal(out.sequences, reference)
    assert len(spy.calls) == 1 + out.stats["steps"]  # prefill + one verify forward per step
    assert not any(call.get("output_hidden_states") for call in spy.calls)
    assert all(states is None for states in spy.hidden_states)


def test_medusa_captures_only_the_last_hidden_state():
    target = tiny_target("llama", layers=3)
    heads = dh.MedusaHeads.for_target(target, num_heads=2, num_layers=1)
    decoder = dh.SpeculativeDecoder(target, heads)
    assert decoder.verifier.feature_layers == (-1,)
    ids = torch.tensor([[5, 9, 7, 11]])
    reference = greedy_reference(target, ids, 8)
    spy = ForwardSpy(target)
    captured = []
    norm = target.get_decoder().norm
    handle = norm.register_forward_hook(lambda _m, _a, out: captured.append(out.shape))
    out = decoder.generate(ids, max_new_tokens=8, eos_token_id=[])
    handle.remove()
    assert torch.equal(out.sequences, reference)
    assert not any(call.get("output_hidden_states") for call in spy.calls)
    assert len(captured) == len(spy.calls)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma", "gemma3_text"])
def test_tapped_features_equal_output_hidden_states(arch):
    """The hooks return exactly what ``output_hidden_states`` would, for the last state and for
    EAGLE-3's layer inputs (any order, the final norm's output and layer 0 included)."""
    target = tiny_target(arch, layers=2)
    ids = torch.randint(3, VOCAB, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = target(ids, output_hidden_states=True).hidden_states
        for layers in [(-1,), (1, 0), (0, 2), (1,)]:
            tap = FeatureTap(target, layers)
            with tap.capture() as got:
                out = target(ids)
            expected = select_features(reference, [len(reference) - 1 if i == -1 else i for i in layers])
            torch.testing.assert_close(tap.features(got, out), expected, rtol=0, atol=0)
            assert not tap.fallback


def test_feature_layers_outside_the_target_are_named():
    target = tiny_target("llama", layers=2)
    with pytest.raises(ValueError, match=r"feature layers \[0, 5\]: \[5\] outside the target's 2 layers"):
        TreeVerifier(target, feature_layers=(0, 5))


def test_eagle3_decodes_exactly_with_tapped_layers():
    target = tiny_target("llama", layers=4)
    heads = dh.Eagle3Head.for_target(target, num_heads=2, feature_layers=[3, 0, 2], draft_vocab_size=32)
    heads.set_draft_vocab(torch.arange(VOCAB, 0, -1))  # untrained heads: any mapping will do
    decoder = dh.SpeculativeDecoder(target, heads)
    assert decoder.verifier.feature_layers == (3, 0, 2)
    ids = torch.tensor([[5, 9, 7, 11, 5, 9]])
    reference = greedy_reference(target, ids, 10)
    spy = ForwardSpy(target)
    out = decoder.generate(ids, max_new_tokens=10, eos_token_id=[])
    assert torch.equal(out.sequences, reference)
    assert not any(call.get("output_hidden_states") for call in spy.calls)


# -- one host read of device data per greedy step ------------------------------------------------
@pytest.fixture(scope="module")
def medusa_setup():
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target)
    return target, heads, prompts


def test_greedy_tree_step_reads_the_device_once(medusa_setup):
    target, heads, prompts = medusa_setup
    decoder = dh.SpeculativeDecoder(target, heads)
    ids = prompts[:1]
    with torch.inference_mode(), HostSyncCounter(target, heads) as syncs:
        out = decoder.generate(ids, max_new_tokens=30, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 30))
    assert max(out.accept_lengths) > 1  # trees with accepted drafts, not only root-only steps
    steps = out.stats["steps"]
    # One per step (the acceptance transfer) plus one at prefill (the first token).
    assert syncs.total_outside <= steps + 1, (dict(syncs.outside), steps)


@pytest.mark.parametrize("rows", [1, 3])
def test_hydra_drafts_without_reading_the_device(rows):
    """Hydra fills its tree depth by depth, each depth's candidates feeding the next one's context:
    the tokens stay on the heads' device, so drafting reads nothing back (the greedy step's one
    read is acceptance's)."""
    target = tiny_target("llama")
    heads = dh.HydraHeads.for_target(target, num_heads=3)
    proposer = heads.proposer(tree=[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    with torch.inference_mode(), HostSyncCounter(target, heads) as syncs:
        hidden = target.get_input_embeddings()(torch.tensor([3, 4, 5][:rows]))  # device data: the target's
        shape, tokens = proposer.draft_rows(torch.tensor([7, 8, 9][:rows]), hidden, max_depth=3)
    assert syncs.total_outside == 0, dict(syncs.outside)
    assert tokens.shape == (rows, shape.size) and tokens[:, 0].tolist() == [7, 8, 9][:rows]
    for r in range(rows):  # each row drafts what a batch of that row alone drafts
        proposer.start([None], [hidden[r : r + 1]], SamplingParams(), None)
        assert torch.equal(proposer.propose([[7, 8, 9][r]], [3])[0].tokens, tokens[r])


def test_the_verifier_follows_the_target_device_and_dtype_it_holds():
    """The verifier reads the target's device and dtype from parameters it holds (transformers'
    properties walk the module tree, several times per step): a later ``target.to`` must show."""
    target = tiny_target("llama")
    verifier = TreeVerifier(target)
    assert (verifier.device, verifier.dtype) == (target.device, target.dtype) == (torch.device("cpu"), torch.float32)
    target.to(torch.float64)
    try:
        assert verifier.dtype == target.dtype == torch.float64
    finally:
        target.to(torch.float32)


def test_greedy_chain_step_reads_the_device_once():
    target = tiny_target("llama")
    decoder = dh.SpeculativeDecoder(target, dh.PromptLookupProposer(num_tokens=4))
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    with torch.inference_mode(), HostSyncCounter(target) as syncs:
        out = decoder.generate(ids, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 20))
    assert syncs.total_outside <= out.stats["steps"] + 1, dict(syncs.outside)


def _batch_of(prompts: torch.Tensor, rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths, left-padded with 0."""
    lists = [prompts[r, r:].tolist() for r in range(rows)]
    width = max(len(x) for x in lists)
    ids = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(lists):
        ids[r, width - len(row):] = torch.tensor(row)
        mask[r, width - len(row):] = 1
    return ids, mask


@pytest.mark.parametrize("method", ["medusa", "prompt-lookup"])
def test_greedy_batch_step_reads_the_device_once_for_all_rows(medusa_setup, method):
    """A batch of 3 rows: one acceptance transfer per step, not one per row (Medusa rows share a tree
    shape; prompt-lookup rows draft chains of different lengths)."""
    target, heads, prompts = medusa_setup
    source = heads if method == "medusa" else dh.PromptLookupProposer(num_tokens=3)
    decoder = dh.SpeculativeDecoder(target, source)
    ids, mask = _batch_of(prompts)
    with torch.inference_mode(), HostSyncCounter(target, heads) as syncs:
        out = decoder.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])
    reference = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=20, pad_token_id=0)
    assert torch.equal(out.sequences, reference)
    if method == "medusa":
        assert max(out.accept_lengths) > 1
    # One per step plus one at prefill (the first tokens of every row).
    assert syncs.total_outside <= out.stats["steps"] + 1, (dict(syncs.outside), out.stats["steps"])


def _deepest_accepted_node(shape: TreeShape, tokens: list[int], predicted: list[int]) -> int:
    """Brute force: a node is accepted when its token is the argmax at its parent and its parent is
    accepted; with distinct sibling tokens at most one node per depth is, and the deepest one wins."""
    ok = [True] + [False] * (shape.size - 1)
    for i in range(1, shape.size):
        p = shape.parents[i]
        ok[i] = ok[p] and tokens[i] == predicted[p]
    depth = shape.depth.tolist()
    return max((i for i in range(shape.size) if ok[i]), key=lambda i: depth[i])


def test_batched_greedy_acceptance_matches_a_brute_force_per_row():
    """Random trees of different shapes in one padded batch (tiny vocabulary: drafts match often):
    per row, the accepted path ends at the deepest node whose whole path matches, the next token
    is the argmax there, and the single-tree acceptance agrees."""
    from draftheads.inference.kv.ragged import pad_trees

    gen = torch.Generator().manual_seed(3)
    shapes = [
        TreeShape.from_choices([[0], [1], [0, 0], [1, 0], [0, 0, 0]]),
        TreeShape.from_choices([[0], [0, 0]]),  # a chain
        TreeShape((-1,)),  # root only
        TreeShape.from_choices([[0], [1], [2], [0, 0], [0, 1], [2, 0], [2, 0, 0]]),
    ]
    vocab = 4
    deep = 0
    for trial in range(60):
        picked = [shapes[int(i)] for i in torch.randint(0, len(shapes), (5,), generator=gen)]
        trees = []
        for shape in picked:  # siblings get distinct tokens, as top-k drafts do
            tokens = [int(torch.randint(0, vocab, (1,), generator=gen))] + [0] * (shape.size - 1)
            for kids in shape.children:
                for kid, tok in zip(kids, torch.randperm(vocab, generator=gen).tolist()):
                    tokens[kid] = tok
            trees.append(Tree(shape, torch.tensor(tokens)))
        padded, _, _ = pad_trees(trees)
        logits = torch.rand(len(trees), padded.shape[1], vocab, generator=gen)
        got = accept_greedy_rows(trees, padded, logits)
        for r, tree in enumerate(trees):
            predicted = logits[r, : tree.shape.size].argmax(-1).tolist()
            node = _deepest_accepted_node(tree.shape, tree.tokens.tolist(), predicted)
            path = []
            while node >= 0:
                path.insert(0, node)
                node = tree.shape.parents[node]
            deep = max(deep, len(path))
            assert got[r].nodes == path, (trial, r)
            assert got[r].tokens == tree.tokens[path].tolist() and got[r].next_token == predicted[path[-1]], (trial, r)
            alone = accept_greedy_rows([tree], tree.tokens[None], logits[None, r, : tree.shape.size])[0]
            assert (alone.nodes, alone.tokens, alone.next_token) == (got[r].nodes, got[r].tokens, got[r].next_token)
    assert deep >= 3  # paths two drafts deep were accepted somewhere


@pytest.mark.parametrize("grad_mode", [torch.no_grad, torch.inference_mode])
def test_the_sync_counter_sees_item_tolist_and_device_data_only(grad_mode):
    """The counter itself: reads of data computed from the modules count, host data does not
    (under inference_mode too, where CPU scalar reads skip the dispatch mode)."""
    layer = torch.nn.Linear(4, 4)
    with grad_mode(), HostSyncCounter(layer, target=None) as syncs:
        y = layer(torch.ones(1, 4))
        int(y.argmax())
        y.tolist()
        if y.sum() > 1e9:  # a branch on device data reads it too
            pass
        torch.tensor([1, 2]).tolist()  # host-built: not a sync on an accelerator either
        int(torch.tensor(3))
        on_host = y.cpu()  # a no-op here, a device-to-host copy on an accelerator
        on_host.tolist()  # ... after which the data is on the host: not another read
        torch.ones(2).cpu()
    assert dict(syncs.outside) == {"item": 2, "tolist": 1, "copy_to_host": 1}, dict(syncs.outside)


# -- tree masks extended on the device, not rebuilt -----------------------------------------------
def test_extended_tree_masks_equal_fresh_ones():
    target = tiny_target("llama")
    verifier = TreeVerifier(target)
    wide = TreeShape.from_choices([[0], [1], [2], [0, 0], [1, 0]])
    other = TreeShape.from_choices([[0], [0, 0], [0, 1], [1], [0, 0, 0]])  # same size, other topology
    masks = []
    for shape, prefix in [(wide, 5), (wide, 6), (other, 9), (wide, 3), (wide, 700), (other, 701)]:
        got = verifier.attention_mask(shape, prefix)
        ref = tree_attention_mask(shape, prefix, target.dtype, target.device)
        assert torch.equal(got, ref), (shape.parents, prefix)
        masks.append(got.data_ptr())
    assert len(set(masks[:4])) == 1  # one buffer for the tree size, until it must grow


def test_static_tree_topology_is_moved_to_the_device_once(medusa_setup):
    target, heads, prompts = medusa_setup
    decoder = dh.SpeculativeDecoder(target, heads)
    shape = decoder.proposer.shape
    decoder.generate(prompts[:1], max_new_tokens=12, eos_token_id=[])
    first = shape.on_device[(target.device, target.dtype)]
    decoder.generate(prompts[1:2], max_new_tokens=12, eos_token_id=[])
    assert shape.on_device[(target.device, target.dtype)] is first


# -- sampling keeps vocabulary rows where they are -----------------------------------------------
def test_inverse_cdf_sampling_follows_the_distribution_and_skips_zero_mass():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    gen = torch.Generator().manual_seed(0)
    draws = torch.tensor([sample_inverse_cdf(probs, gen) for _ in range(1500)])
    counts = torch.bincount(draws, minlength=6).float()
    assert counts[[0, 2, 5]].sum() == 0
    expected = probs * draws.numel()
    chi2 = float(((counts[[1, 3, 4]] - expected[[1, 3, 4]]) ** 2 / expected[[1, 3, 4]]).sum())
    assert chi2 < 13.8  # chi-square, 2 degrees of freedom, p = 0.001


def test_sampling_acceptance_takes_no_vocabulary_row_to_the_host(medusa_setup):
    target, heads, prompts = medusa_setup
    verifier = TreeVerifier(target)
    shape = TreeShape.from_choices([[0], [1], [0, 0]])
    tree = Tree(shape, torch.tensor([5, 6, 7, 8]))
    with torch.no_grad():
        cache = DynamicCache()
        target(prompts[:1], use_cache=True, **{verifier.cache_arg: cache})
        logits, _ = verifier.forward(cache, tree, prompts.shape[1])
    params = dh.inference.sampling.resolve_sampling(None, True, 1.0, 0, 1.0)
    with HostSyncCounter(target) as syncs:
        accept_sampling(tree, logits, params, torch.Generator().manual_seed(0))
    assert "tolist" not in syncs.outside and "copy_to_host" not in syncs.outside  # scalars only


def test_models_of_another_layout_fall_back_to_all_hidden_states(monkeypatch):
    """Without `layers` and `norm` to hook, the tap asks for output_hidden_states: more memory,
    same features."""
    monkeypatch.setattr("draftheads.inference.features._decoder_modules", lambda target: None)
    target = tiny_target("llama", layers=2)
    ids = torch.randint(3, VOCAB, (1, 10), generator=torch.Generator().manual_seed(0))
    tap = FeatureTap(target, (1, -1))
    assert tap.fallback and tap.forward_kwargs() == {"output_hidden_states": True}
    with torch.no_grad():
        reference = target(ids, output_hidden_states=True).hidden_states
        with tap.capture() as got:
            out = target(ids, **tap.forward_kwargs())
    torch.testing.assert_close(tap.features(got, out), torch.cat([reference[1], reference[2]], -1), rtol=0, atol=0)
    assert FeatureTap(target, ()).forward_kwargs() == {} and FeatureTap(target, ()).features({}, out) is None


def test_drafting_into_the_cache_does_not_read_positions_back():
    """EAGLE's draft layer sizes its RoPE table from the draft cache's capacity, not from
    ``positions.max()``: on a GPU the positions live on the device and that read is a sync per depth."""
    target = tiny_target("llama", layers=2)
    head = dh.EagleHead.for_target(target, num_heads=2).eval()
    hidden = target.config.hidden_size
    cache = head.new_cache(32, torch.device("cpu"), torch.float32)
    features, tokens = torch.randn(1, 3, hidden), torch.tensor([[5, 6, 7]])
    mask = torch.ones(1, 3, 7, dtype=torch.bool)
    with torch.no_grad(), HostSyncCounter(head, target=None) as syncs:
        positions = torch.tensor([[4, 5, 6]])
        syncs.taint(positions)  # stands for positions built on the accelerator
        g, attn_in = head.first_input(features, tokens)
        head.run_layers(g, attn_in, positions, mask, cache=cache, cache_length=4)
    assert syncs.total_outside == 0, dict(syncs.outside)


@pytest.mark.parametrize("head_type", ["medusa", "hydra"])
def test_drawn_drafts_read_nothing_back(head_type):
    """Drawing a chain (sampling's default) keeps the drawn tokens on the heads' device too: the
    uniforms go to the device, the inverse CDF runs there."""
    target = tiny_target("llama")
    cls = dh.MedusaHeads if head_type == "medusa" else dh.HydraHeads
    proposer = cls.for_target(target, num_heads=3).proposer(tree=[[0], [0, 0], [0, 0, 0]])
    params = SamplingParams(temperature=0.8, top_k=20, sample_drafts=True)
    with torch.inference_mode(), HostSyncCounter(target, proposer.heads) as syncs:
        hidden = target.get_input_embeddings()(torch.tensor([3, 4]))
        trees = proposer.draw_chains([7, 8], hidden, [3, 2], params, torch.Generator().manual_seed(0))
    assert syncs.total_outside == 0, dict(syncs.outside)
    assert [t.shape.size for t in trees] == [4, 3] and all(t.draft_probs is not None for t in trees)
