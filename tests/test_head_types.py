"""Hydra, EAGLE and EAGLE-3 heads: trained with the real losses, lossless through the same verifier.

Each head type is trained for a few seconds with the training module's own loss
(`TargetWithHeads`, the loss `train.py` uses) on the target's greedy continuations, so that the
exactness tests run with drafts that are accepted often (asserted), not with drafts that are
all rejected. Sampling is checked against the exact law of the target, as for Medusa heads.
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import draftheads as dh
from draftheads.config import ConfigError, config_from_dict
from draftheads.methods.eagle3.heads import default_feature_layers
from draftheads.inference.sampling import SamplingParams
from draftheads.registry import TreeKind, method_of
from draftheads.train.model import TargetWithHeads

from inference_utils import greedy_reference, tiny_target
from stats import law_pvalue
from test_sampling import drafts_accepted, empirical_counts, exact_distribution

HEAD_TYPES = {
    "hydra": (dh.HydraHeads, {"num_heads": 3}),
    "eagle": (dh.EagleHead, {"num_heads": 1}),
    "eagle3": (dh.Eagle3Head, {"num_heads": 3, "draft_vocab_size": 48}),
}


def trained_heads(target, head_type: str, steps: int = 100, seed: int = 0):
    """Heads of ``head_type`` trained with `TargetWithHeads`' loss; returns (heads, prompts)."""
    cls, kwargs = HEAD_TYPES[head_type]
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (32, 6), generator=gen)
    with torch.no_grad():
        seqs = greedy_reference(target, prompts, 40)
    torch.manual_seed(seed)
    heads = cls.for_target(target, **kwargs)
    if heads.own_draft_vocabulary:
        heads.set_draft_vocab(torch.bincount(seqs.flatten(), minlength=vocab))
    model = TargetWithHeads(target, heads, labels="target")
    opt = torch.optim.Adam(heads.parameters(), lr=3e-3)
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, prompts.shape[1] :] = 1  # learn on generated text only
    first = None
    for _ in range(steps):
        loss = model(seqs, loss_mask=loss_mask)["loss"]
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < first, f"{head_type} training loss did not decrease ({first:.4f} -> {float(loss):.4f})"
    return heads.eval(), prompts


@pytest.fixture(scope="module", params=[(t, a) for t in HEAD_TYPES for a in ("llama", "qwen2")], ids=lambda p: f"{p[0]}-{p[1]}")
def trained(request):
    head_type, arch = request.param
    target = tiny_target(arch)
    heads, prompts = trained_heads(target, head_type)
    return head_type, target, heads, prompts


def test_greedy_matches_generate_with_accepted_drafts(trained):
    head_type, target, heads, prompts = trained
    decoder = dh.SpeculativeDecoder(target, heads)
    lengths = []
    for i, new in enumerate((40, 40, 40, 7, 2, 1)):
        ids = prompts[i : i + 1]
        out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, new)), f"{head_type}: output differs from generate"
        if new == 40:
            lengths += out.accept_lengths
    fresh = torch.tensor([[5, 9, 33, 17]])  # a prompt the heads never saw: rejections happen
    assert torch.equal(decoder.generate(fresh, max_new_tokens=30, eos_token_id=[]).sequences, greedy_reference(target, fresh, 30))
    mean = sum(lengths) / len(lengths)
    assert mean > 1.5, f"{head_type}: mean accepted length {mean:.2f}: the drafts are barely used"


def test_greedy_stops_at_eos_like_generate(trained):
    head_type, target, heads, prompts = trained
    decoder = dh.SpeculativeDecoder(target, heads)
    ids = prompts[:1]
    ref = greedy_reference(target, ids, 40)
    eos = int(ref[0, ids.shape[1] + 5])  # a token the target emits at position 5
    expected = greedy_reference(target, ids, 40, eos=eos)
    assert torch.equal(decoder.generate(ids, max_new_tokens=40, eos_token_id=eos).sequences, expected)


def test_save_load_round_trip_is_bit_exact_and_decodes_the_same(trained, tmp_path):
    head_type, target, heads, prompts = trained
    heads.save_pretrained(tmp_path / "heads")
    loaded = dh.load_heads(tmp_path / "heads", target=target)
    assert type(loaded) is type(heads)
    for (name, a), (_, b) in zip(heads.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    ids = prompts[:1]
    a = dh.SpeculativeDecoder(target, heads).generate(ids, max_new_tokens=20, eos_token_id=[])
    b = dh.SpeculativeDecoder(target, loaded).generate(ids, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(a.sequences, b.sequences) and a.accept_lengths == b.accept_lengths
    # the target's embedding and LM head are never stored with the heads
    stored = load_file(str(tmp_path / "heads" / "model.safetensors"))
    frozen = [target.get_input_embeddings().weight] + ([target.get_output_embeddings().weight] if head_type != "hydra" else [])
    assert not any(v.shape == w.shape and torch.equal(v, w) for v in stored.values() for w in frozen)


# -- sampling: the target's exact law, with drafts that are accepted ---------------------------------
VOCAB = 6


@pytest.mark.parametrize("head_type", list(HEAD_TYPES))
def test_sampling_follows_the_target_distribution(head_type):
    target = tiny_target("llama", seed=3, vocab=VOCAB, hidden=32, layers=1)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    cls, kwargs = HEAD_TYPES[head_type]
    kwargs = {**kwargs, "draft_vocab_size": 5} if head_type == "eagle3" else kwargs
    torch.manual_seed(0)
    heads = cls.for_target(target, **kwargs)
    if heads.own_draft_vocabulary:
        heads.set_draft_vocab(torch.tensor([1, 5, 4, 3, 2, 6]))
    tree = [[0], [1], [0, 0], [0, 1], [1, 0]] if head_type == "hydra" else {"total_tokens": 6, "depth": 2, "top_k": 2}
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draw_drafts=False)  # top-k trees (drawn: test_drawn_drafts)
    prompt = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    dist = exact_distribution(target, prompt, params)
    counts = empirical_counts(decoder, prompt, params)
    pvalue = law_pvalue(counts, dist)
    assert pvalue > 1e-3, f"{head_type}: chi-square p-value {pvalue:.2g}: not the target's distribution"
    accepted = drafts_accepted(decoder, prompt, params)
    assert accepted >= 5, f"{head_type}: drafts accepted in only {accepted}/50 runs: the test would be vacuous"


# -- EAGLE tree settings and bad input ------------------------------------------------------------
def test_eagle_tree_respects_budget_and_is_connected():
    target = tiny_target("llama")
    heads = dh.EagleHead.for_target(target)
    for total, depth, top_k in ((2, 1, 1), (8, 3, 2), (12, 5, 4), (30, 6, 5)):
        proposer = heads.proposer(tree={"total_tokens": total, "depth": depth, "top_k": top_k})
        prompt = torch.tensor([1, 7, 9, 4])
        with torch.no_grad():
            hidden = target(prompt[None], output_hidden_states=True).hidden_states[-1][0]
        proposer.start([prompt], [hidden], SamplingParams(), None)
        (tree,) = proposer.propose([11], [depth])
        assert tree.shape.size == min(total, 1 + top_k + (depth - 1) * top_k * top_k)
        assert tree.shape.max_depth <= depth and int(tree.tokens[0]) == 11
        check_is_a_tree_of_continuations(tree)
        # the first level is the draft's top_k after the root: a node hung under the wrong parent
        # (flattened, or re-indexed off by one) puts other tokens there
        first = heads.proposer(tree={"total_tokens": 1 + top_k, "depth": 1, "top_k": top_k})
        first.start([prompt], [hidden], SamplingParams(), None)
        top = set(first.propose([11], [1])[0].tokens[1:].tolist())
        assert {int(tree.tokens[c]) for c in tree.shape.children[0]} <= top
        assert proposer.propose([11], [0])[0].shape.size == 1  # at the token limit: root only


def check_is_a_tree_of_continuations(tree) -> None:
    """Every node's parent is an earlier node of the tree, and the token paths (root to node) are
    distinct and prefix-closed: siblings draft different tokens, so no candidate is verified twice."""
    parents, tokens = tree.shape.parents, tree.tokens.tolist()
    assert parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, len(parents)))
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(parents)):
        paths.append(paths[parents[i]] + (tokens[i],))
    assert len(set(paths)) == len(paths), f"two nodes draft the same continuation: {paths}"
    assert all(path[:-1] in set(paths) for path in paths[1:])
    assert max(map(len, paths)) == tree.shape.max_depth


def test_eagle_settings_are_validated():
    target = tiny_target("llama")
    heads = dh.EagleHead.for_target(target)
    with pytest.raises(ValueError, match="top_k must be a positive integer"):
        heads.proposer(tree={"top_k": 0})
    with pytest.raises(ValueError, match="dynamic tree"):
        dh.SpeculativeDecoder(target, heads, tree=[[0], [1]])


def test_eagle3_checkpoint_without_vocab_mapping_is_refused(tmp_path):
    target = tiny_target("llama")
    heads = dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=16)
    heads.save_pretrained(tmp_path / "unset")  # never trained: mapping never set
    with pytest.raises(ValueError, match="no draft-vocabulary mapping"):
        dh.load_heads(tmp_path / "unset", target=target)
    heads.set_draft_vocab(torch.arange(target.config.vocab_size))
    heads.save_pretrained(tmp_path / "ok")
    dh.load_heads(tmp_path / "ok", target=target)
    weights = tmp_path / "ok" / "model.safetensors"
    state = load_file(str(weights))
    del state["draft_to_target"]
    save_file(state, str(weights))
    with pytest.raises(ValueError, match="missing: draft_to_target"):
        dh.load_heads(tmp_path / "ok", target=target)


def test_eagle3_mapping_follows_token_counts():
    target = tiny_target("llama")
    heads = dh.Eagle3Head.for_target(target, draft_vocab_size=3)
    counts = torch.zeros(target.config.vocab_size, dtype=torch.long)
    counts[[40, 7, 12, 3]] = torch.tensor([5, 9, 5, 1])
    heads.set_draft_vocab(counts)
    assert heads.draft_to_target.tolist() == [7, 12, 40]
    assert heads.target_to_draft[[7, 12, 40, 3]].tolist() == [0, 1, 2, -1]
    heads.check_vocab_mapping()


def test_feature_layers_outside_the_target_are_refused():
    target = tiny_target("llama", layers=2)
    with pytest.raises(ValueError, match=r"feature layer ids \[7\] are outside the target's layer range"):
        dh.Eagle3Head.for_target(target, feature_layers=[0, 1, 7])
    assert dh.Eagle3Head.for_target(target, draft_vocab_size=8).feature_layers == [0, 1, 2]  # 2 layers: spread
    assert default_feature_layers(32) == [2, 16, 29] and default_feature_layers(4) == [1, 2, 3]


def test_unknown_head_type_lists_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match="valid: dflash, dflash2, dspark, eagle, eagle3, hydra, medusa, mtp, peagle"):
        config_from_dict({"heads": {"head_type": "medussa"}})
    target = tiny_target("llama")
    dh.MedusaHeads.for_target(target, num_heads=1).save_pretrained(tmp_path / "h")
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    cfg["head_type"] = "hydra2"
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unknown head_type 'hydra2'; valid: dflash, dflash2, dspark, eagle, eagle3, hydra, medusa, mtp, peagle"):
        dh.load_heads(tmp_path / "h")


def test_fresh_heads_start_from_the_targets_own_prediction():
    """Zero-initialised outputs: a fresh Hydra head and a fresh EAGLE layer reproduce the target's
    next-token logits exactly (the starting point training improves on)."""
    target = tiny_target("llama")
    ids = torch.tensor([[1, 5, 9, 14, 3]])
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        hidden = out.hidden_states[-1]
        hydra = dh.HydraHeads.for_target(target, num_heads=2)
        context = torch.randint(3, 64, (1, 5, 2))
        assert torch.allclose(hydra(hidden, context)[:, :, 0], out.logits, atol=1e-5)
        eagle = dh.EagleHead.for_target(target)
        g, attn_in = eagle.first_input(hidden, ids)
        n = ids.shape[1]
        state, _ = eagle.run_layers(g, attn_in, torch.arange(n)[None], torch.ones(n, n, dtype=torch.bool).tril()[None])
        assert torch.allclose(eagle.logits(state), out.logits, atol=1e-5)


def test_dynamic_tree_calibration_is_saved_and_used(tmp_path):
    from draftheads.heads.io import TREE_NAME, write_json_atomically
    from draftheads.tune.calibrate import calibrate_dynamic_tree

    target = tiny_target("llama")
    heads, prompts = trained_heads(target, "eagle", steps=40)
    grid = [{"total_tokens": 4, "depth": 2, "top_k": 2}, {"total_tokens": 8, "depth": 4, "top_k": 2}]
    result = calibrate_dynamic_tree(target, heads, [prompts[i : i + 1] for i in range(2)], new_tokens=12, grid=grid, rounds=1)
    assert len(result.candidates) == 3 and result.tree in grid + [{"total_tokens": 1, "depth": 1, "top_k": 1}]
    assert result.tokens_per_second == max(c["tokens_per_second"] for c in result.candidates)  # plain is a candidate
    assert result.candidates[0]["mean_accept_length"] == 1.0
    heads.save_pretrained(tmp_path / "h")
    write_json_atomically(tmp_path / "h" / TREE_NAME, {"tree": result.tree, "calibration": result.to_json()})
    loaded = dh.load_heads(tmp_path / "h", target=target)
    proposer = dh.SpeculativeDecoder(target, loaded).proposer
    assert (proposer.total_tokens, proposer.depth, proposer.top_k) == tuple(result.tree[k] for k in ("total_tokens", "depth", "top_k"))
    (tmp_path / "h" / TREE_NAME).write_text(json.dumps({"tree": {"total_tokens": 0, "depth": 3}}))
    with pytest.raises(ValueError, match="total_tokens must be a positive integer"):
        dh.load_heads(tmp_path / "h", target=target)


def test_eagle_restricted_draft_vocabulary_drafts_only_frequent_tokens_and_stays_exact():
    target = tiny_target("llama")
    heads, prompts = trained_heads(target, "eagle", steps=40)
    heads.token_counts.zero_()
    frequent = torch.arange(3, 19)
    heads.token_counts[frequent] = 10
    decoder = dh.SpeculativeDecoder(target, heads, tree={"total_tokens": 8, "depth": 3, "top_k": 2, "draft_vocab_size": 16})
    proposer = decoder.proposer
    assert proposer.vocab_ids.tolist() == frequent.tolist()
    ids = prompts[:1]
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[-1][0]
    proposer.start([ids[0]], [hidden], SamplingParams(), None)
    (tree,) = proposer.propose([5], [3])
    assert set(tree.tokens[1:].tolist()) <= set(frequent.tolist())
    assert torch.equal(decoder.generate(ids, max_new_tokens=30, eos_token_id=[]).sequences, greedy_reference(target, ids, 30))


def test_draft_layer_fast_inference_path_matches_the_training_path():
    """Drafting fuses q/k/v and gate/up and looks RoPE up in a table; training uses the plain
    modules: both must compute the same layer (and the fused weights follow weight updates)."""
    from draftheads.heads.draft_layer import DraftLayer

    torch.manual_seed(0)
    layer = DraftLayer(32, 64, 4, 2, 8, 48, 1e-6, 10000.0, input_norm=True)
    torch.nn.init.normal_(layer.o_proj.weight, std=0.05)
    torch.nn.init.normal_(layer.down_proj.weight, std=0.05)
    x, attn_in = torch.randn(1, 5, 32), torch.randn(1, 5, 64)
    positions = torch.tensor([[3, 4, 5, 5, 6]])
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None]
    for _ in range(2):
        slow, (k_slow, _) = layer(x, attn_in, positions, mask)
        with torch.no_grad():
            fast, (k_fast, _) = layer(x, attn_in, positions, mask)
        assert torch.allclose(slow, fast, atol=1e-5) and torch.allclose(k_slow, k_fast, atol=1e-5)
        with torch.no_grad():
            layer.k_proj.weight.add_(0.1)  # an optimizer step: the fused copy must not go stale


def test_every_head_type_declares_its_traits():
    """Training and calibration ask the head class what it is (no lists of type names): each
    registered type names HeadsSpec fields that exist and a known training objective."""
    import dataclasses

    from draftheads.config import HeadsSpec
    from draftheads.heads import head_types
    from draftheads.train.loop import build_heads

    fields = {f.name for f in dataclasses.fields(HeadsSpec)}
    for name, cls in head_types().items():
        assert set(cls.spec_options) <= fields, name
        assert cls.training_objective in ("future_tokens", "draft_steps", "parallel_depths", "block"), name
        assert (method_of(cls).tree is TreeKind.DYNAMIC) == (cls.training_objective == "draft_steps"), name
    target = tiny_target("llama")
    heads = build_heads(HeadsSpec(head_type="eagle3", num_heads=2, feature_layers=[0, 1], draft_vocab_size=16), target)
    assert heads.feature_layers == [0, 1] and heads.draft_to_target.numel() == 16
    heads = build_heads(HeadsSpec(head_type="eagle", noise=0.3), target)
    assert heads.config.extra["noise"] == 0.3
