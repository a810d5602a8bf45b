"""DFlash2 heads: DFlash's block with a grouped dynamic convolution per layer and a candidate
selector, trained with the real loss, lossless as chain and tree (each node ranked by the selector
after its own parent's token), in batches, under sampling; vLLM's layout out and in.

Heads are trained for a few seconds on the target's greedy continuations (`block_heads_utils`)."""
from __future__ import annotations

import copy
import json

import pytest
import torch

import draftheads as dh
from draftheads.inference.sampling import SamplingParams
from draftheads.methods.dflash.loss import block_mask
from draftheads.methods.dflash2.drafter import DFlash2Drafter
from draftheads.methods.dflash2.heads import DFlash2Heads
from draftheads.train.model import TargetWithHeads

from block_heads_utils import MASK_ID, TREE, trained_block_heads, tree_tokens_follow_their_parents
from inference_utils import greedy_reference, tiny_target
from stats import law_pvalue
from test_batch import check_rows_exact
from test_sampling import drafts_accepted, empirical_counts, exact_distribution

BLOCK = 4  # K = 3 drafted tokens per forward
OPTIONS = {"block_size": BLOCK, "selector_rank": 8, "selector_top_k": 4, "conv_group_size": 8}


def dflash2(target, **options) -> DFlash2Heads:
    settings = {"num_layers": 1, "mask_token_id": MASK_ID, "num_anchors": 16, **OPTIONS}
    return DFlash2Heads.for_target(target, **{**settings, **options})


def perturbed(heads: DFlash2Heads, seed: int = 3) -> DFlash2Heads:
    """Convolutions off the identity and a selector that matters: every DFlash2 tensor changes the drafts."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in heads.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.add_(torch.randn(conv.base_kernel.shape, generator=gen) * 0.3)
                conv.kernel_projection.weight.add_(torch.randn(conv.kernel_projection.weight.shape, generator=gen) * 0.05)
        sel = heads.candidate_selector
        for p in (sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight):
            p.copy_(torch.randn(p.shape, generator=gen))
    return heads


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request):
    target = tiny_target(request.param, layers=3)
    heads, prompts, first, last = trained_block_heads(DFlash2Heads, target, **OPTIONS)
    return request.param, target, heads, prompts, first, last


def test_training_lowers_the_loss_and_moves_the_convolution_and_selector(trained):
    arch, _, heads, _, (loss0, acc0), (loss1, acc1) = trained
    assert loss1 < loss0, f"{arch}: dflash2 loss {loss0:.4f} -> {loss1:.4f}"
    assert acc1 > acc0 + 0.2, f"{arch}: depth-1 top-1 accuracy {acc0:.2f} -> {acc1:.2f}"
    conv = heads.layers[0].attention_conv
    assert float(conv.kernel_projection.weight.detach().abs().max()) > 0, "the dynamic kernel never left zero"
    assert float((conv.base_kernel.detach()[:, 1:]).abs().max()) > 0, "the convolution's second tap never trained"


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
    fresh = torch.tensor([[5, 9, 33, 17]])
    assert torch.equal(decoder.generate(fresh, max_new_tokens=30, eos_token_id=[]).sequences, greedy_reference(target, fresh, 30))
    mean = sum(lengths) / len(lengths)
    assert mean > 1.5, f"{arch}: mean accepted length {mean:.2f}: the drafts are barely used"


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_left_padded_batch_rows_match_generate(trained, tree):
    _, target, heads, prompts, _, _ = trained
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11], [1, 20, 33, 40, 5]]
    check_rows_exact(target, heads if tree is None else heads.proposer(tree=tree), rows)


def test_a_tree_node_is_its_parents_selector_candidate(trained):
    _, target, heads, prompts, _, _ = trained
    seq = greedy_reference(target, prompts[:1], 10)[0]
    with torch.no_grad():
        _, features, _ = TargetWithHeads(target, heads).target_outputs(seq[None])
    drafter = DFlash2Drafter(heads, tree=TREE)
    drafter.start([seq[:6]], [features[0, :6]], SamplingParams(), None)
    (tree,) = drafter.propose([int(seq[6])], [3])
    with torch.inference_mode():
        tree_tokens_follow_their_parents(drafter, tree, int(seq[6]))


def test_training_blocks_compute_what_drafting_computes(trained):
    """Several blocks of a row in one training forward (the convolution inside each block only)
    equal the drafter's block for the same anchor, and the selector scores agree."""
    _, target, heads, prompts, _, _ = trained
    heads = perturbed(copy.deepcopy(heads))  # the fixture's heads stay as trained
    with torch.no_grad():
        seq = greedy_reference(target, prompts[3:4], 20)
        _, features, _ = TargetWithHeads(target, heads).target_outputs(seq)
    anchors = torch.tensor([[4, 9, 15]])
    with torch.no_grad():
        positions = (anchors[:, :, None] + torch.arange(BLOCK)).view(1, -1)
        tokens = heads.block_inputs(seq.gather(1, anchors)).view(1, -1)
        kv = heads.context_kv(heads.context(features), torch.arange(seq.shape[1])[None])
        mask = block_mask(anchors, torch.ones_like(anchors, dtype=torch.bool), torch.ones_like(seq, dtype=torch.bool), BLOCK)
        train = heads.logits(heads.block_states(tokens, positions, kv, mask)).view(anchors.shape[1], BLOCK, -1)
    for j, a in enumerate(anchors[0].tolist()):
        drafter = DFlash2Drafter(heads)
        drafter.start([seq[0, :a]], [features[0, :a]], SamplingParams(), None)
        got = drafter.block_logits([int(seq[0, a])])[0]
        assert torch.allclose(got, train[j], atol=1e-4), f"anchor {a}: training block differs from drafting"


def test_the_convolution_mixes_a_slot_with_the_ones_before_it_only():
    from draftheads.methods.dflash2.heads import GroupedConv

    conv = GroupedConv(hidden=8, taps=2, group=4, block=3)
    with torch.no_grad():
        conv.base_kernel.normal_()
        conv.kernel_projection.weight.normal_()
    x = torch.randn(1, 6, 8)  # two blocks of 3
    y, delta = conv.prepare(x)
    x2 = x.clone()
    x2[0, 2] += 1.0  # the last slot of the first block
    y2, _ = conv.prepare(x2)
    changed = (y2 - y).abs().sum(-1)[0] > 0
    assert changed.tolist() == [False, False, True, False, False, False], "a slot read a later slot or another block"
    x3 = x.clone()
    x3[0, 3] += 1.0  # the first slot of the second block
    y3, _ = conv.prepare(x3)
    assert ((y3 - y).abs().sum(-1)[0] > 0).tolist() == [False, False, False, True, True, False]


def test_sampling_follows_the_target_distribution():
    target = tiny_target("llama", seed=3, vocab=6, hidden=32, layers=2)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(4.0)
    torch.manual_seed(0)
    heads = perturbed(DFlash2Heads.for_target(target, num_layers=1, block_size=3, mask_token_id=5, selector_rank=4,
                                              selector_top_k=3, conv_group_size=8))
    prompt = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    dist = exact_distribution(target, prompt, params)
    for draw in (False, True):
        tree = [[0], [1], [0, 0], [0, 1], [1, 0]] if not draw else None
        decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draw_drafts=draw)
        pvalue = law_pvalue(empirical_counts(decoder, prompt, params), dist)
        assert pvalue > 1e-3, f"draw_drafts={draw}: chi-square p-value {pvalue:.2g}: not the target's distribution"
        accepted = drafts_accepted(decoder, prompt, params)
        assert accepted >= 5, f"draw_drafts={draw}: drafts accepted in only {accepted}/50 runs: the test would be vacuous"


# -- bad input ----------------------------------------------------------------------------------------
def test_a_convolution_that_does_not_fit_the_block_or_the_hidden_size_is_refused():
    target = tiny_target("llama", layers=3)  # hidden 64
    with pytest.raises(ValueError, match=r"conv_group_size 12 must be a whole number dividing the hidden size 64"):
        dflash2(target, conv_group_size=12)
    with pytest.raises(ValueError, match=r"conv_kernel_size must be a whole number in 1\.\.4"):
        dflash2(target, conv_kernel_size=5)
    with pytest.raises(ValueError, match=r"selector_top_k must be a whole number in 1\.\.64"):
        dflash2(target, selector_top_k=65)
    with pytest.raises(ValueError, match=r"selector_rank must be a whole number >= 1"):
        dflash2(target, selector_rank=0)


def test_a_tree_rank_past_the_selectors_candidates_or_a_draft_vocabulary_is_refused():
    target = tiny_target("llama", layers=3)
    heads = dflash2(target)
    with pytest.raises(ValueError, match=r"selector keeps 4 candidates per slot"):
        dh.SpeculativeDecoder(target, heads, tree=[[0], [4]])
    with pytest.raises(ValueError, match="draft_vocab_size=16 does not apply"):
        heads.proposer(draft_vocab_size=16)
    with pytest.raises(ValueError, match="at most 3 deep"):
        dh.SpeculativeDecoder(target, heads, tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


def test_a_block_larger_than_the_rows_is_refused_and_the_config_takes_the_options():
    from draftheads.config import ConfigError, config_from_dict
    from draftheads.train.loop import build_heads

    with pytest.raises(ConfigError, match=r"longer than the rows \(data.max_length=8\)"):
        config_from_dict({"heads": {"head_type": "dflash2", "block_size": 9}, "data": {"max_length": 8}})
    cfg = config_from_dict({"heads": {"head_type": "dflash2", "block_size": 5, "conv_group_size": 8, "selector_top_k": 8,
                                      "selector_rank": 16, "selector_alpha": 0.5}})
    heads = build_heads(cfg.heads, tiny_target("llama", layers=3))
    assert heads.block_size == 5 and heads.selector_top_k == 8 and heads.config.extra["selector_alpha"] == 0.5
    with pytest.raises(ConfigError, match="selector_top_k"):
        config_from_dict({"heads": {"head_type": "dspark", "selector_top_k": 8}})


# -- vLLM's layout out and back in ---------------------------------------------------------------------
def _exported(tmp_path):
    from draftheads.export import export_heads

    target = tiny_target("llama", layers=3)
    target.save_pretrained(tmp_path / "target")
    torch.manual_seed(1)
    heads = perturbed(dflash2(target, num_layers=2, feature_layers=[1, 2]))
    heads.save_pretrained(tmp_path / "heads")
    return target, heads, export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier=str(tmp_path / "target"),
                                       engine_check=False)


def test_vllm_export_writes_the_dflash2_layout(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    import draftheads.methods.runner_check as runner_check
    from draftheads.export import export_heads
    from draftheads.export.common import ExportError

    _, heads, out = _exported(tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlash2DraftModel"] and config["block_size"] == BLOCK
    assert config["dflash_config"] == {"mask_token_id": MASK_ID, "target_layer_ids": [0, 1], "causal": False,
                                       "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8, "selector_top_k": 4}
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["layers.1.attention_conv.base_kernel"].shape == (2, 2, 64)
    assert tensors["layers.0.mlp_conv.kernel_projection.weight"].shape == (2 * 2 * 8, 64)
    assert tensors["candidate_selector.predecessor_codebook"].shape == (64, 8)
    assert tensors["candidate_selector.hidden_projection.weight"].shape == (8, 64)
    with pytest.raises(ExportError, match=r"serves exactly 3 \(got 4\)"):
        export_heads(tmp_path / "heads", tmp_path / "v4", "vllm", num_speculative_tokens=4, engine_check=False)
    cpu = runner_check.InstalledVLLM("/venv/bin/python", "0.32.0", False, frozenset({"DFlash2DraftModel"}))
    monkeypatch.setattr(runner_check, "installed_vllm", lambda: cpu)
    with pytest.raises(ExportError, match="DFlash2 drafts run only on vLLM's Model Runner V2"):
        export_heads(tmp_path / "heads", tmp_path / "cpu", "vllm")


def test_z_lab_and_speculators_dflash2_checkpoints_import_to_the_same_heads(tmp_path):
    from safetensors.torch import load_file, save_file

    from draftheads.export.importers import detect_format, import_heads
    from draftheads.export.sources import read_source

    target, heads, out = _exported(tmp_path)
    config = json.loads((out / "config.json").read_text())
    spec = tmp_path / "spec"
    spec.mkdir()
    layer_cfg = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                        "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size")}
    (spec / "config.json").write_text(json.dumps({
        "architectures": ["DFlash2DraftModel"], "speculators_model_type": "dflash2",
        "transformer_layer_config": {**layer_cfg, "model_type": "qwen3", "num_hidden_layers": 2},
        "draft_vocab_size": 64, "block_size": BLOCK, "aux_hidden_state_layer_ids": [1, 2], "mask_token_id": MASK_ID,
        "conv_kernel_size": 2, "conv_group_size": 8, "selector_rank": 8, "selector_top_k": 4,
        "speculators_config": {"algorithm": "dflash2"},
    }))
    copies = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().clone(),
              "lm_head.weight": target.get_output_embeddings().weight.detach().clone()}
    save_file({**load_file(str(out / "model.safetensors")), **copies}, str(spec / "model.safetensors"))
    assert detect_format(read_source(out)) == "dflash2" and detect_format(read_source(spec)) == "speculators-dflash2"
    ids = torch.tensor([[5, 9, 33, 17, 4]])
    expected = dh.SpeculativeDecoder(target, heads, tree=TREE).generate(ids, max_new_tokens=20, eos_token_id=[])
    for name, src in (("zlab", out), ("spec", spec)):
        loaded = dh.load_heads(import_heads(src, tmp_path / f"imported-{name}", target), target=target)
        assert type(loaded) is DFlash2Heads
        for key, value in heads.state_dict().items():
            if key != "token_counts":
                assert torch.equal(value, loaded.state_dict()[key]), f"{name}: {key}"
        got = dh.SpeculativeDecoder(target, loaded, tree=TREE).generate(ids, max_new_tokens=20, eos_token_id=[])
        assert torch.equal(got.sequences, expected.sequences) and got.accept_lengths == expected.accept_lengths


def test_the_acceptance_table_conditions_on_the_true_previous_token(trained):
    from draftheads.methods.dflash2.search import selector_accuracy_table

    _, target, heads, prompts, _, _ = trained
    seqs = [greedy_reference(target, prompts[i : i + 1], 24)[0] for i in range(2)]
    table = selector_accuracy_table(target, heads, seqs, max_rank=6, skip_prompt=[prompts.shape[1]] * 2)
    assert table.shape == (BLOCK - 1, 6) and float(table[:, 4:].sum()) == 0.0  # ranks past the 4 candidates never hit
