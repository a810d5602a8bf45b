"""DSpark heads: DFlash's block plus a Markov head and a confidence head, trained with the real
loss, lossless as chain and tree (the tree read node by node off each parent's token), in batches,
under sampling; the confidence head's estimates drive the verify width; vLLM's layout out and in.

Heads are trained for a few seconds on the target's greedy continuations (`block_heads_utils`), so
exactness runs with drafts that are accepted often (asserted)."""
from __future__ import annotations

import json
from collections import deque

import pytest
import torch

import draftheads as dh
from draftheads.inference.draft_budget import OnlineDraftBudget
from draftheads.inference.sampling import SamplingParams
from draftheads.methods.dflash.loss import block_mask
from draftheads.methods.dspark.drafter import DSparkDrafter
from draftheads.methods.dspark.heads import DSparkHeads
from draftheads.train.model import TargetWithHeads

from block_heads_utils import MASK_ID, TREE, trained_block_heads, tree_tokens_follow_their_parents
from inference_utils import greedy_reference, tiny_target
from stats import law_pvalue
from test_batch import check_rows_exact
from test_sampling import drafts_accepted, empirical_counts, exact_distribution

BLOCK = 3  # sample_from_anchor: the root's slot drafts too, so K = 3 drafts per forward
RANK = 8


def dspark(target, **options) -> DSparkHeads:
    settings = {"num_layers": 1, "block_size": BLOCK, "mask_token_id": MASK_ID, "num_anchors": 16, "markov_rank": RANK}
    return DSparkHeads.for_target(target, **{**settings, **options})


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request):
    target = tiny_target(request.param, layers=3)
    heads, prompts, first, last = trained_block_heads(DSparkHeads, target, block_size=BLOCK, markov_rank=RANK)
    return request.param, target, heads, prompts, first, last


def test_training_lowers_the_loss_and_learns_the_markov_head(trained):
    arch, _, heads, _, (loss0, acc0), (loss1, acc1) = trained
    assert heads.config.num_heads == BLOCK and heads.first_slot == 0
    assert loss1 < loss0, f"{arch}: dspark loss {loss0:.4f} -> {loss1:.4f}"
    assert acc1 > acc0 + 0.2, f"{arch}: depth-1 top-1 accuracy {acc0:.2f} -> {acc1:.2f}"
    assert float(heads.markov_head.markov_w2.weight.detach().abs().max()) > 0, "the Markov projection never left zero"
    assert float(heads.confidence_head.proj.weight.detach().abs().max()) > 0, "the confidence head never trained"


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_greedy_matches_generate_with_accepted_drafts(trained, tree):
    arch, target, heads, prompts, _, _ = trained
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
    lengths = []
    for i, new in enumerate((40, 40, 40, 7, 2, 1)):
        ids = prompts[i : i + 1]
        out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, new)), f"{arch} {tree}: output differs from generate"
        if new == 40:
            lengths += out.accept_lengths
        assert out.stats["dspark"]["draft_forwards"] <= len(out.accept_lengths), "more than one draft forward per step"
    fresh = torch.tensor([[5, 9, 33, 17]])  # never seen: rejections happen
    assert torch.equal(decoder.generate(fresh, max_new_tokens=30, eos_token_id=[]).sequences, greedy_reference(target, fresh, 30))
    mean = sum(lengths) / len(lengths)
    assert mean > 1.5, f"{arch}: mean accepted length {mean:.2f}: the drafts are barely used"


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_left_padded_batch_rows_match_generate(trained, tree):
    _, target, heads, prompts, _, _ = trained
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11], [1, 20, 33, 40, 5]]
    check_rows_exact(target, heads if tree is None else heads.proposer(tree=tree), rows)


def test_static_cache_decodes_the_same(trained):
    arch, target, heads, prompts, _, _ = trained
    ids = prompts[:1]
    out = dh.SpeculativeDecoder(target, heads, tree=TREE, cache="static").generate(ids, max_new_tokens=30, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 30)), f"{arch}: static cache output differs"


def test_a_tree_node_is_its_parents_candidate_given_the_parents_token(trained):
    """The Markov head makes a block's drafts depend on each other: each node is ranked off its OWN
    parent's token, so siblings' subtrees differ where a position-only read (DFlash's) would
    repeat them."""
    _, target, heads, prompts, _, _ = trained
    seq = greedy_reference(target, prompts[:1], 10)[0]
    with torch.no_grad():
        _, features, _ = TargetWithHeads(target, heads).target_outputs(seq[None])
    drafter = DSparkDrafter(heads, tree=TREE)
    drafter.start([seq[:6]], [features[0, :6]], SamplingParams(), None)
    (tree,) = drafter.propose([int(seq[6])], [3])
    with torch.inference_mode():
        tree_tokens_follow_their_parents(drafter, tree, int(seq[6]))
    with torch.no_grad():
        heads.markov_head.markov_w2.weight.mul_(50.0)  # a strong bias: the two depth-1 nodes' children must differ
    try:
        drafter = DSparkDrafter(heads, tree=[[0], [1], [0, 0], [1, 0]])
        drafter.start([seq[:6]], [features[0, :6]], SamplingParams(), None)
        (tree,) = drafter.propose([int(seq[6])], [2])
        assert int(tree.tokens[3]) != int(tree.tokens[4]), "siblings' children equal: the Markov head is not conditioned on them"
    finally:
        with torch.no_grad():
            heads.markov_head.markov_w2.weight.div_(50.0)


def test_training_blocks_compute_what_drafting_computes(trained):
    """One block of the training forward (masked, all blocks of the row at once) plus the Markov
    bias of the data's previous tokens equals the drafter's conditioned scores for the same anchor."""
    _, target, heads, prompts, _, _ = trained
    with torch.no_grad():
        seq = greedy_reference(target, prompts[3:4], 20)
        _, features, _ = TargetWithHeads(target, heads).target_outputs(seq)
    anchors = torch.tensor([[4, 9, 15]])
    with torch.no_grad():
        positions = (anchors[:, :, None] + torch.arange(BLOCK)).view(1, -1)
        tokens = heads.block_inputs(seq.gather(1, anchors)).view(1, -1)
        kv = heads.context_kv(heads.context(features), torch.arange(seq.shape[1])[None])
        mask = block_mask(anchors, torch.ones_like(anchors, dtype=torch.bool), torch.ones_like(seq, dtype=torch.bool), BLOCK)
        states = heads.block_states(tokens, positions, kv, mask).view(anchors.shape[1], BLOCK, -1)
    for j, a in enumerate(anchors[0].tolist()):
        previous = seq[0, a : a + BLOCK]  # draft d's previous token: the data's token a + d - 1
        train = heads.logits(states[j]) + heads.markov_bias(previous)
        drafter = DSparkDrafter(heads)
        drafter.start([seq[0, :a]], [features[0, :a]], SamplingParams(), None)
        with torch.inference_mode():
            slots = drafter.scores([int(seq[0, a])], [BLOCK])
            got = torch.stack([drafter.step_scores(slots, torch.zeros(1, dtype=torch.long), d, previous[d - 1 : d])[0]
                               for d in range(1, BLOCK + 1)])
        assert torch.allclose(got, train, atol=1e-4), f"anchor {a}: training block differs from drafting"


def test_sampling_follows_the_target_distribution():
    target = tiny_target("llama", seed=3, vocab=6, hidden=32, layers=2)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    torch.manual_seed(0)
    heads = DSparkHeads.for_target(target, num_layers=1, block_size=2, mask_token_id=5, markov_rank=3)
    with torch.no_grad():
        heads.markov_head.markov_w2.weight.normal_(0.0, 1.0)  # a Markov bias that changes the drafts
    prompt = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    dist = exact_distribution(target, prompt, params)
    for draw in (False, True):  # top-k trees (point masses), then drawn chains (conditional laws)
        tree = [[0], [1], [0, 0], [0, 1], [1, 0]] if not draw else None
        decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draw_drafts=draw)
        pvalue = law_pvalue(empirical_counts(decoder, prompt, params), dist)
        assert pvalue > 1e-3, f"draw_drafts={draw}: chi-square p-value {pvalue:.2g}: not the target's distribution"
        accepted = drafts_accepted(decoder, prompt, params)
        assert accepted >= 5, f"draw_drafts={draw}: drafts accepted in only {accepted}/50 runs: the test would be vacuous"


# -- the confidence head and the verify width ------------------------------------------------------
def test_chain_confidences_are_the_running_product_of_the_heads_estimates(trained):
    _, target, heads, prompts, _, _ = trained
    seq = greedy_reference(target, prompts[:1], 10)[0]
    with torch.no_grad():
        _, features, _ = TargetWithHeads(target, heads).target_outputs(seq[None])
    drafter = DSparkDrafter(heads)
    drafter.start([seq[:6], seq[:5]], [features[0, :6], features[0, :5]], SamplingParams(), None)
    trees = drafter.propose([int(seq[6]), int(seq[5])], [3, 0])
    estimates = drafter.acceptance_estimates()
    assert estimates[1] == [] and len(estimates[0]) == 3
    chain = trees[0].tokens.cpu()
    with torch.inference_mode():
        states = drafter.draft_states([int(seq[6]), int(seq[5])], [3, 0])[0]
        conf = torch.sigmoid(heads.confidence_logits(states, chain[:3]))
    assert torch.allclose(torch.tensor(estimates[0]), conf.cumprod(0), atol=1e-5)
    assert all(a >= b for a, b in zip(estimates[0], estimates[0][1:]))
    tree_drafter = DSparkDrafter(heads, tree=TREE)
    tree_drafter.start([seq[:6]], [features[0, :6]], SamplingParams(), None)
    tree_drafter.propose([int(seq[6])], [3])
    assert tree_drafter.acceptance_estimates() is None, "a tree's siblings have no estimate: none is handed over"


def test_the_budget_verifies_what_the_estimates_and_the_step_costs_say():
    """With costs measured (a step's seconds growing with the width verified), the budget admits
    the slots whose estimates pay for their share of the cost, best first, each row's first always."""
    budget = OnlineDraftBudget(margin=0.0)
    for cap, seconds in ((0, 1.0), (1, 1.1), (2, 1.2), (3, 2.4)):
        budget._seconds.setdefault(2, {})[cap] = deque([seconds] * 3, maxlen=9)
    estimates = [[0.9, 0.8, 0.7], [0.5, 0.1, 0.05]]
    # T = 2 (first slots): 2.4 / 1.1; T = 3: +0.8 over cap 1.5 (1.15 s); T = 4: +0.7 over cap 2 (1.2 s); T = 5, 6: over cap 2.5, 3
    depths = budget.verify_depths(estimates, [3, 3])
    assert depths == [3, 1], depths  # +0.8 and +0.7 pay for widths 1.5 and 2; +0.1 not for 2.5 (1.8 s)
    sure = [[0.99, 0.98, 0.97], [0.99, 0.98, 0.97]]
    assert budget.verify_depths(sure, [3, 3]) == [2, 2]  # a width of 3 costs twice a width of 2: it does not pay
    budget._seconds[2][3] = deque([1.3] * 3, maxlen=9)
    assert budget.verify_depths(sure, [3, 3]) == [3, 3]  # now everything pays
    assert budget.verify_depths([[0.9], []], [1, 0]) == [1, 0]
    assert not OnlineDraftBudget(use_estimates=False).uses_estimates  # the off switch keeps the budget's own rule


def test_confidence_driven_width_is_lossless_and_cuts_steps(trained):
    _, target, heads, prompts, _, _ = trained
    budget = OnlineDraftBudget(warmup=1, min_samples=1, margin=0.0)
    decoder = dh.SpeculativeDecoder(target, heads, draft_budget=budget)
    for i in range(4):
        ids = prompts[i : i + 1]
        out = decoder.generate(ids, max_new_tokens=40, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, 40))
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist()]
    from test_batch import left_padded, reference

    ids, mask = left_padded(rows)
    out = dh.SpeculativeDecoder(target, heads, draft_budget=OnlineDraftBudget(warmup=1, min_samples=1)).generate(
        ids, attention_mask=mask, max_new_tokens=30, eos_token_id=[])
    assert torch.equal(out.sequences, reference(target, ids, mask, new=30))


# -- bad input ----------------------------------------------------------------------------------------
def test_a_markov_rank_of_zero_or_above_the_vocabulary_is_refused():
    target = tiny_target("llama", layers=3)
    for rank in (0, 65, -1, 2.5):
        with pytest.raises(ValueError, match=r"markov_rank must be a whole number in 1\.\.64"):
            dspark(target, markov_rank=rank)
    assert dspark(target, markov_rank=64).markov_rank == 64


def test_a_block_larger_than_the_rows_is_refused_in_the_config():
    from draftheads.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=r"longer than the rows \(data.max_length=8\)"):
        config_from_dict({"heads": {"head_type": "dspark", "block_size": 9}, "data": {"max_length": 8}})
    cfg = config_from_dict({"heads": {"head_type": "dspark", "block_size": 4, "markov_rank": 16, "confidence_alpha": 0.5}})
    from draftheads.train.loop import build_heads

    heads = build_heads(cfg.heads, tiny_target("llama", layers=3))
    assert heads.block_size == 4 and heads.config.num_heads == 4 and heads.markov_rank == 16
    assert heads.config.extra["confidence_alpha"] == 0.5
    with pytest.raises(ConfigError, match="markov_rank"):
        config_from_dict({"heads": {"head_type": "dflash", "markov_rank": 16}})


def test_a_tree_deeper_than_the_block_is_refused():
    target = tiny_target("llama", layers=3)
    with pytest.raises(ValueError, match="at most 3 deep"):
        dh.SpeculativeDecoder(target, dspark(target), tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


# -- vLLM's layout out and back in ---------------------------------------------------------------------
def _exported(tmp_path, **options):
    from draftheads.export import export_heads

    target = tiny_target("llama", layers=3)
    target.save_pretrained(tmp_path / "target")
    torch.manual_seed(1)
    heads = dspark(target, num_layers=2, feature_layers=[1, 2], **options)
    with torch.no_grad():  # a trained-looking head: every tensor matters
        heads.markov_head.markov_w2.weight.normal_(0.0, 0.5)
        heads.confidence_head.proj.weight.normal_(0.0, 0.1)
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier=str(tmp_path / "target"), engine_check=False)
    return target, heads, out


def test_vllm_export_writes_qwen3_dspark_and_pins_what_vllm_would_change(tmp_path):
    from safetensors.torch import load_file

    from draftheads.export import export_heads
    from draftheads.export.common import ExportError

    _, heads, out = _exported(tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"] and config["model_type"] == "qwen3"
    assert config["target_layer_ids"] == [0, 1] and config["mask_token_id"] == MASK_ID and "dflash_config" not in config
    assert config["sample_from_anchor"] is True and config["is_causal"] is False and config["block_size"] == BLOCK
    assert config["markov_rank"] == RANK and config["markov_head_type"] == "vanilla"
    assert config["enable_confidence_head"] is True and config["confidence_head_with_markov"] is True
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["markov_head.markov_w1.weight"].shape == (64, RANK)
    assert tensors["markov_head.markov_w2.weight"].shape == (64, RANK)
    assert tensors["confidence_head.proj.weight"].shape == (1, 64 + RANK) and tensors["confidence_head.proj.bias"].shape == (1,)
    assert not any(k.startswith(("model.", "embed_tokens", "lm_head")) for k in tensors)
    with pytest.raises(ExportError, match=r"serves exactly 3 \(got 2\)"):
        export_heads(tmp_path / "heads", tmp_path / "v2", "vllm", num_speculative_tokens=2, engine_check=False)


def test_an_export_for_a_runner_the_installed_vllm_lacks_is_refused_by_name(tmp_path, monkeypatch):
    import draftheads.methods.runner_check as runner_check
    from draftheads.export import export_heads
    from draftheads.export.common import ExportError

    _exported(tmp_path)
    cpu = runner_check.InstalledVLLM("/venv/bin/python", "0.32.0", False, frozenset({"Qwen3DSparkModel", "DFlashDraftModel"}))
    monkeypatch.setattr(runner_check, "installed_vllm", lambda: cpu)
    with pytest.raises(ExportError, match=r"DSpark drafts run only on vLLM's Model Runner V2.*0\.32\.0.*--no-engine-check"):
        export_heads(tmp_path / "heads", tmp_path / "a", "vllm")
    old = runner_check.InstalledVLLM("/venv/bin/python", "0.20.0", True, frozenset({"DFlashDraftModel"}))
    monkeypatch.setattr(runner_check, "installed_vllm", lambda: old)
    with pytest.raises(ExportError, match=r"vLLM 0\.20\.0 .* has no Qwen3DSparkModel"):
        export_heads(tmp_path / "heads", tmp_path / "b", "vllm")
    gpu = runner_check.InstalledVLLM("/venv/bin/python", "0.32.0", True, frozenset({"Qwen3DSparkModel"}))
    monkeypatch.setattr(runner_check, "installed_vllm", lambda: gpu)
    assert export_heads(tmp_path / "heads", tmp_path / "c", "vllm").is_dir()
    monkeypatch.setattr(runner_check, "installed_vllm", lambda: None)  # nothing installed: nothing to check against
    assert export_heads(tmp_path / "heads", tmp_path / "d", "vllm").is_dir()


def _speculators_folder(tmp_path, out, heads):
    """The same weights in speculators' dspark layout (the DFlash fill-in layout by default)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((out / "config.json").read_text())
    spec = tmp_path / "spec"
    spec.mkdir()
    layer_cfg = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                        "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size")}
    (spec / "config.json").write_text(json.dumps({
        "architectures": ["DSparkSpeculator"], "speculators_model_type": "dspark",
        "transformer_layer_config": {**layer_cfg, "model_type": "qwen3", "num_hidden_layers": 2},
        "draft_vocab_size": config["vocab_size"], "block_size": BLOCK, "aux_hidden_state_layer_ids": [1, 2],
        "mask_token_id": MASK_ID, "markov_rank": RANK, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "sample_from_anchor": True, "speculators_config": {"algorithm": "dspark"},
    }))
    save_file(load_file(str(out / "model.safetensors")), str(spec / "model.safetensors"))
    return spec


def test_native_and_speculators_dspark_checkpoints_import_to_the_same_heads(tmp_path):
    from draftheads.export.importers import detect_format, import_heads
    from draftheads.export.sources import read_source

    target, heads, out = _exported(tmp_path)
    spec = _speculators_folder(tmp_path, out, heads)
    assert detect_format(read_source(out)) == "dspark" and detect_format(read_source(spec)) == "speculators-dspark"
    ids = torch.tensor([[5, 9, 33, 17, 4]])
    expected = dh.SpeculativeDecoder(target, heads, tree=TREE).generate(ids, max_new_tokens=20, eos_token_id=[])
    for name, src in (("native", out), ("spec", spec)):
        loaded = dh.load_heads(import_heads(src, tmp_path / f"imported-{name}", target), target=target)
        assert type(loaded) is DSparkHeads and loaded.first_slot == 0 and loaded.markov_rank == RANK
        for key, value in heads.state_dict().items():
            if key != "token_counts":
                assert torch.equal(value, loaded.state_dict()[key]), f"{name}: {key}"
        got = dh.SpeculativeDecoder(target, loaded, tree=TREE).generate(ids, max_new_tokens=20, eos_token_id=[])
        assert torch.equal(got.sequences, expected.sequences) and got.accept_lengths == expected.accept_lengths


def test_dspark_checkpoints_draftheads_cannot_decode_exactly_are_refused_by_name(tmp_path):
    import shutil

    from draftheads.export.importers import import_heads

    target, _, out = _exported(tmp_path)

    def variant(name, edit):
        folder = tmp_path / name
        shutil.copytree(out, folder)
        config = json.loads((folder / "config.json").read_text())
        edit(config)
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    with pytest.raises(ValueError, match="markov_head_type 'gated'"):
        import_heads(variant("gated", lambda c: c.update(markov_head_type="gated")), tmp_path / "a", target)
    with pytest.raises(ValueError, match="markov_rank must be a whole number"):
        import_heads(variant("rank", lambda c: c.update(markov_rank=0)), tmp_path / "b", target)
    with pytest.raises(ValueError, match="causal draft layers"):
        import_heads(variant("causal", lambda c: c.update(is_causal=True)), tmp_path / "c", target)


def test_a_calibrated_draft_vocabulary_exports_with_the_markov_rows_and_imports_back(tmp_path):
    from draftheads.export import export_heads
    from draftheads.export.importers import import_heads
    from draftheads.plans import given_tree
    from safetensors.torch import load_file

    target = tiny_target("llama", layers=3)
    target.save_pretrained(tmp_path / "target")
    torch.manual_seed(2)
    heads = dspark(target, feature_layers=[1, 2])
    with torch.no_grad():
        heads.markov_head.markov_w2.weight.normal_(0.0, 0.5)
    heads.token_counts.copy_(torch.arange(64) % 7 + 1)
    heads.save_pretrained(tmp_path / "heads", plans=given_tree(dh.StaticTree.chain(BLOCK), 24))
    out = export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier=str(tmp_path / "target"), engine_check=False)
    config, tensors = json.loads((out / "config.json").read_text()), load_file(str(out / "model.safetensors"))
    ids = heads.draft_vocab(24)
    assert config["draft_vocab_size"] == 24 and torch.equal(tensors["d2t"] + torch.arange(24), ids)
    assert torch.equal(tensors["markov_head.markov_w2.weight"], heads.markov_head.markov_w2.weight.detach()[ids])
    loaded = dh.load_heads(import_heads(out, tmp_path / "back", target), target=target)
    prompt = torch.tensor([[5, 9, 33, 17, 4]])
    expected = dh.SpeculativeDecoder(target, heads.proposer(draft_vocab_size=24)).generate(prompt, max_new_tokens=20, eos_token_id=[])
    got = dh.SpeculativeDecoder(target, loaded).generate(prompt, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(got.sequences, expected.sequences) and got.accept_lengths == expected.accept_lengths


# -- the tree search's measurements ------------------------------------------------------------------
def test_the_acceptance_table_conditions_each_depth_on_the_true_previous_token(trained):
    from draftheads.methods.dspark.search import draft_seconds, markov_accuracy_table

    _, target, heads, prompts, _, _ = trained
    seqs = [greedy_reference(target, prompts[i : i + 1], 24)[0] for i in range(2)]
    table = markov_accuracy_table(target, heads, seqs, max_rank=4, skip_prompt=[prompts.shape[1]] * 2)
    assert table.shape == (BLOCK, 4) and float(table[0, 0]) > 0.3  # seen continuations: depth 1 mostly right
    seconds = draft_seconds(heads)
    assert seconds[0] == 0.0 and len({v for d, v in seconds.items() if d > 0}) == 1


def test_the_fill_in_layout_decodes_exactly_too():
    """sample_from_anchor off (speculators' default): slot 0 drafts nothing and a block of B drafts B-1,
    DFlash's layout; the Markov stage still conditions each draft on the one before."""
    target = tiny_target("qwen2", layers=3)
    torch.manual_seed(3)
    heads = dspark(target, block_size=4, sample_from_anchor=False)
    with torch.no_grad():
        heads.markov_head.markov_w2.weight.normal_(0.0, 1.0)
    assert heads.first_slot == 1 and heads.config.num_heads == 3
    ids = torch.tensor([[5, 9, 33, 17, 4]])
    for tree in (None, TREE):
        out = dh.SpeculativeDecoder(target, heads, tree=tree).generate(ids, max_new_tokens=24, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, 24))
