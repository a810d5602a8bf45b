"""DFlash heads: trained with the real loss, a whole block per draft forward, lossless as chain and tree.

Heads are trained for a few seconds with `TargetWithHeads` (the loss `train.py` uses) on the
target's greedy continuations, so exactness runs with drafts that are accepted often (asserted).
The training path (all blocks of a row in one masked forward) must compute, for each block, what
the drafter's cached single-block forward computes: that equality is what makes the loss train
the drafter that decodes.
"""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.methods.dflash.heads import DFlashHeads, default_feature_layers
from draftheads.methods.dflash.drafter import DFlashDrafter
from draftheads.inference.sampling import SamplingParams
from draftheads.methods.dflash.loss import anchor_candidates, block_mask, draw_anchors
from draftheads.train.model import TargetWithHeads

from inference_utils import greedy_reference, tiny_target
from stats import law_pvalue
from test_batch import check_rows_exact
from test_sampling import drafts_accepted, empirical_counts, exact_distribution

BLOCK = 4  # K = 3 drafted tokens per forward
MASK_ID = 63  # the tiny targets' last id (their pad id 0 has a zero embedding row: refused, see below)
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def dflash_heads(target, **options) -> DFlashHeads:
    settings = {"num_layers": 1, "block_size": BLOCK, "mask_token_id": MASK_ID, "num_anchors": 16}
    return DFlashHeads.for_target(target, **{**settings, **options})


def trained_dflash(target, steps: int = 60, seed: int = 0, prompts: torch.Tensor | None = None, **options):
    """DFlash heads trained with `TargetWithHeads`' loss; returns (heads, prompts, first, last) where
    first/last are (loss, slot-1 top-1 accuracy against the target's greedy token), averaged over
    the first and the last 5 steps. The tiny targets' distributions are nearly flat, so the soft
    cross-entropy (KL + the target's entropy) moves little while the top-1 accuracy moves a lot."""
    vocab = target.config.vocab_size
    if prompts is None:
        prompts = torch.randint(3, vocab, (32, 6), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        seqs = greedy_reference(target, prompts, 40)
    torch.manual_seed(seed)
    heads = dflash_heads(target, **options)
    model = TargetWithHeads(target, heads)
    opt = torch.optim.Adam(heads.parameters(), lr=3e-3)
    loss_mask = torch.zeros_like(seqs)
    loss_mask[:, prompts.shape[1] :] = 1  # learn on generated text only
    history = []
    model.train()
    for step in range(steps):
        model.reseed_noise(step, seqs.device)
        out = model(seqs, loss_mask=loss_mask)
        stats = out["stats"]
        history.append((float(out["loss"].detach()), float(stats[2, 0] / stats[1, 0])))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()

    def mean(rows):
        return tuple(sum(r[i] for r in rows) / len(rows) for i in range(2))

    return heads.eval(), prompts, mean(history[:5]), mean(history[-5:])


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def trained(request):
    target = tiny_target(request.param, layers=3)
    heads, prompts, first, last = trained_dflash(target)
    return request.param, target, heads, prompts, first, last


def test_training_lowers_the_loss(trained):
    arch, _, heads, _, (loss0, acc0), (loss1, acc1) = trained
    assert heads.feature_layers == [1, 2]
    assert loss1 < loss0, f"{arch}: dflash loss {loss0:.4f} -> {loss1:.4f}"
    assert acc1 > acc0 + 0.2, f"{arch}: slot-1 top-1 accuracy {acc0:.2f} -> {acc1:.2f}"


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
        assert out.stats["dflash"]["draft_forwards"] <= len(out.accept_lengths), "more than one draft forward per step"
    fresh = torch.tensor([[5, 9, 33, 17]])  # never seen: rejections happen
    assert torch.equal(decoder.generate(fresh, max_new_tokens=30, eos_token_id=[]).sequences, greedy_reference(target, fresh, 30))
    mean = sum(lengths) / len(lengths)
    assert mean > 1.5, f"{arch}: mean accepted length {mean:.2f}: the drafts are barely used"


def test_static_cache_decodes_the_same(trained):
    arch, target, heads, prompts, _, _ = trained
    ids = prompts[:1]
    out = dh.SpeculativeDecoder(target, heads, tree=TREE, cache="static").generate(ids, max_new_tokens=30, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, ids, 30)), f"{arch}: static cache output differs"


def test_default_tree_is_the_chain_of_the_block(trained):
    _, target, heads, _, _, _ = trained
    decoder = dh.SpeculativeDecoder(target, heads)
    assert decoder.proposer.shape.max_depth == BLOCK - 1 and decoder.proposer.shape.size == BLOCK


def test_greedy_stops_at_eos_like_generate(trained):
    _, target, heads, prompts, _, _ = trained
    ids = prompts[:1]
    eos = int(greedy_reference(target, ids, 40)[0, ids.shape[1] + 5])
    out = dh.SpeculativeDecoder(target, heads).generate(ids, max_new_tokens=40, eos_token_id=eos)
    assert torch.equal(out.sequences, greedy_reference(target, ids, 40, eos=eos))


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_left_padded_batch_rows_match_generate(trained, tree):
    _, target, heads, prompts, _, _ = trained
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11], [1, 20, 33, 40, 5]]
    source = heads if tree is None else heads.proposer(tree=tree)
    check_rows_exact(target, source, rows)


def test_training_blocks_compute_what_drafting_computes(trained):
    """One block of the training forward (masked, all blocks of the row at once) equals the
    drafter's block over the cached context for the same anchor."""
    _, target, heads, prompts, _, _ = trained
    with torch.no_grad():
        seq = greedy_reference(target, prompts[3:4], 20)
        model = TargetWithHeads(target, heads)
        _, features, _ = model.target_outputs(seq)
    anchors = torch.tensor([[4, 9, 15]])
    valid = torch.ones_like(anchors, dtype=torch.bool)
    n = anchors.shape[1]
    with torch.no_grad():
        positions = (anchors[:, :, None] + torch.arange(BLOCK)).view(1, -1)
        tokens = heads.block_inputs(seq.gather(1, anchors)).view(1, -1)
        kv = heads.context_kv(heads.context(features), torch.arange(seq.shape[1])[None])
        mask = block_mask(anchors, valid, torch.ones_like(seq, dtype=torch.bool), BLOCK)
        train_logits = heads.logits(heads.block_states(tokens, positions, kv, mask)).view(n, BLOCK, -1)
    for j, a in enumerate(anchors[0].tolist()):
        drafter = DFlashDrafter(heads)
        drafter.start([seq[0, :a]], [features[0, :a]], SamplingParams(), None)
        got = drafter.block_logits([int(seq[0, a])])[0]
        assert torch.allclose(got, train_logits[j], atol=1e-4), f"anchor {a}: training block differs from drafting"


def test_anchors_are_distinct_trained_positions_with_room_for_a_block():
    ids = torch.arange(20)[None].repeat(2, 1)
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, 8:] = 1
    attn = torch.ones_like(ids)
    attn[1, 15:] = 0  # right padding
    cand = anchor_candidates(ids, loss_mask, attn, 4)
    assert cand[0].nonzero().squeeze(-1).tolist() == list(range(7, 17))  # next token trained, a + 3 <= 19
    assert cand[1].nonzero().squeeze(-1).tolist() == list(range(7, 12))  # block inside the 15 real tokens
    anchors, valid = draw_anchors(cand, 8, torch.Generator().manual_seed(0))
    assert valid[0].all() and int(valid[1].sum()) == 5
    for row in range(2):
        picked = anchors[row][valid[row]].tolist()
        assert picked == sorted(set(picked)) and all(bool(cand[row, a]) for a in picked)


def test_block_mask_sees_the_context_before_its_anchor_and_its_own_block():
    anchors = torch.tensor([[2, 5]])
    mask = block_mask(anchors, torch.ones(1, 2, dtype=torch.bool), torch.ones(1, 8, dtype=torch.bool), 3)[0]
    assert mask.shape == (6, 8 + 6)
    assert mask[0, :8].tolist() == [True, True] + [False] * 6  # block of anchor 2: positions 0, 1
    assert mask[3, :8].tolist() == [True] * 5 + [False] * 3  # block of anchor 5: positions 0..4
    assert mask[:3, 8:].tolist() == [[True] * 3 + [False] * 3] * 3  # bidirectional in its own block only
    assert mask[3:, 8:].tolist() == [[False] * 3 + [True] * 3] * 3


def test_ce_objective_trains_too():
    target = tiny_target("llama", layers=3)
    _, _, (loss0, acc0), (loss1, acc1) = trained_dflash(target, steps=30, loss="ce")
    assert loss1 < 0.9 * loss0 and acc1 > acc0, f"ce: loss {loss0:.3f} -> {loss1:.3f}, top-1 {acc0:.2f} -> {acc1:.2f}"


def test_save_load_round_trip_decodes_the_same(trained, tmp_path):
    _, target, heads, prompts, _, _ = trained
    heads.save_pretrained(tmp_path / "heads")
    loaded = dh.load_heads(tmp_path / "heads", target=target)
    assert type(loaded) is DFlashHeads and loaded.config.extra["mask_token_id"] == MASK_ID
    for (name, a), (_, b) in zip(heads.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    ids = prompts[:1]
    a = dh.SpeculativeDecoder(target, heads).generate(ids, max_new_tokens=20, eos_token_id=[])
    b = dh.SpeculativeDecoder(target, loaded).generate(ids, max_new_tokens=20, eos_token_id=[])
    assert torch.equal(a.sequences, b.sequences) and a.accept_lengths == b.accept_lengths


# -- sampling: the target's exact law --------------------------------------------------------------
def test_sampling_follows_the_target_distribution():
    target = tiny_target("llama", seed=3, vocab=6, hidden=32, layers=2)
    with torch.no_grad():  # sharper logits than the random init, so mistakes move real mass
        target.get_output_embeddings().weight.mul_(4.0)
    torch.manual_seed(0)
    heads = DFlashHeads.for_target(target, num_layers=1, block_size=3, mask_token_id=5)
    # top-k trees (drawn chains: test_drawn_drafts)
    decoder = dh.SpeculativeDecoder(target, heads, tree=[[0], [1], [0, 0], [0, 1], [1, 0]], draw_drafts=False)
    prompt = torch.tensor([[1, 4, 3]])
    params = SamplingParams(temperature=0.9, top_k=5)
    dist = exact_distribution(target, prompt, params)
    pvalue = law_pvalue(empirical_counts(decoder, prompt, params), dist)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue:.2g}: not the target's distribution"
    accepted = drafts_accepted(decoder, prompt, params)
    assert accepted >= 5, f"drafts accepted in only {accepted}/50 runs: the test would be vacuous"


# -- bad input ----------------------------------------------------------------------------------------
def test_feature_layers_out_of_range_or_final_are_refused():
    target = tiny_target("llama", layers=3)
    with pytest.raises(ValueError, match=r"valid ids are 1\.\.2.*3 is the final hidden state"):
        dflash_heads(target, feature_layers=[1, 3])
    with pytest.raises(ValueError, match="0 is the embedding"):
        dflash_heads(target, feature_layers=[0, 1])
    with pytest.raises(ValueError, match="increasing order"):
        dflash_heads(target, feature_layers=[2, 1])


def test_default_feature_layers_spread_like_z_lab():
    assert default_feature_layers(36) == [2, 10, 18, 26, 34]  # z-lab's [1, 9, 17, 25, 33], as inputs of layers
    assert default_feature_layers(32) == [2, 9, 16, 23, 30]  # Llama-3.1-8B
    assert default_feature_layers(8) == [2, 3, 4, 5, 6]
    assert all(1 <= f <= L - 1 for L in range(2, 40) for f in default_feature_layers(L))


def test_tree_deeper_than_the_block_is_refused():
    target = tiny_target("llama", layers=3)
    heads = dflash_heads(target)
    with pytest.raises(ValueError, match="at most 3 deep"):
        dh.SpeculativeDecoder(target, heads, tree=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])
    with pytest.raises(ValueError, match="static tree"):
        dh.SpeculativeDecoder(target, heads, tree={"total_tokens": 4, "depth": 2, "top_k": 2})


class _Tokenizer:
    """What `choose_mask_token` reads of a tokenizer."""

    def __init__(self, size, special=(1, 2), mask=None, pad=None):
        self.size, self.all_special_ids, self.mask_token_id = size, list(special), mask
        self.bos_token_id, self.eos_token_id, self.pad_token_id = 1, 2, pad

    def __len__(self):
        return self.size

    def convert_ids_to_tokens(self, i):
        return f"tok{i}"


def test_mask_token_is_an_id_the_tokenizer_never_produces():
    target = tiny_target("llama", layers=3)
    heads = dflash_heads(target, mask_token_id=None)
    assert heads.choose_mask_token(_Tokenizer(60)) == 60  # the first embedding row without a token
    heads = dflash_heads(target, mask_token_id=None)
    assert heads.choose_mask_token(_Tokenizer(64, special=(1, 2, 5), mask=5)) == 5  # the tokenizer's mask token
    heads = dflash_heads(target, mask_token_id=None)
    assert heads.choose_mask_token(_Tokenizer(64, special=(3, 1, 2), pad=3)) == 3  # a special pad token
    with pytest.raises(ValueError, match="embedding row is all zeros"):  # the tiny Llama's padding row 0
        dflash_heads(target, mask_token_id=None).choose_mask_token(_Tokenizer(64, special=(0, 1, 2), pad=0))
    with pytest.raises(ValueError, match="set heads.mask_token_id"):
        dflash_heads(target, mask_token_id=None).choose_mask_token(_Tokenizer(64))
    with pytest.raises(ValueError, match="set heads.mask_token_id"):  # a pad that is an ordinary token or EOS
        dflash_heads(target, mask_token_id=None).choose_mask_token(_Tokenizer(64, pad=2))
    with pytest.raises(ValueError, match="ordinary token 'tok7'"):
        dflash_heads(target, mask_token_id=7).choose_mask_token(_Tokenizer(64))
    with pytest.raises(ValueError, match="BOS/EOS"):
        dflash_heads(target, mask_token_id=2).choose_mask_token(_Tokenizer(64))
    with pytest.raises(RuntimeError, match="no mask token"):
        dh.SpeculativeDecoder(target, dflash_heads(target, mask_token_id=None))


def test_experiment_config_takes_dflash_options():
    from draftheads.config import ConfigError, config_from_dict
    from draftheads.train.loop import build_heads

    cfg = config_from_dict({"heads": {"head_type": "dflash", "block_size": 5, "num_layers": 2, "feature_layers": [1, 2],
                                      "loss_gamma": 4.0, "mask_token_id": 0}})
    heads = build_heads(cfg.heads, tiny_target("llama", layers=3))
    assert heads.block_size == 5 and heads.config.num_heads == 4 and len(heads.layers) == 2
    assert torch.allclose(heads.slot_weights(), torch.exp(-torch.arange(4.0) / 4.0))
    with pytest.raises(ConfigError, match="block_size"):
        config_from_dict({"heads": {"head_type": "medusa", "block_size": 5}})


def test_training_chooses_the_tree_with_one_block_forward_as_the_cost_of_every_depth(trained):
    from draftheads.tune.training import choose_export_tree

    _, target, heads, prompts, _, _ = trained
    table = [[0.9] + [0.05] * 9] * (BLOCK - 1)  # an accurate first rank at every slot
    data = choose_export_tree(target, heads, [greedy_reference(target, prompts[:1], 20)[0]], rank_accuracy=table)
    drafted = {int(k): v for k, v in data["draft_seconds"].items() if int(k) > 0}
    assert len(set(drafted.values())) == 1 and len(drafted) == BLOCK - 1  # one forward, whatever the depth
    assert data["chosen_by"] == "training" and all(len(p) <= BLOCK - 1 for p in data["tree"])
    decoder = dh.SpeculativeDecoder(target, heads, tree=data["tree"])
    ids = prompts[:1]
    assert torch.equal(decoder.generate(ids, max_new_tokens=20, eos_token_id=[]).sequences, greedy_reference(target, ids, 20))


# -- vLLM export ---------------------------------------------------------------------------------------
def test_vllm_export_writes_the_z_lab_layout_and_pins_what_vllm_would_change(tmp_path):
    import json

    from safetensors.torch import load_file

    from draftheads.export import export_heads
    from draftheads.export.common import ExportError

    target = tiny_target("llama", layers=3)
    target.save_pretrained(tmp_path / "target")
    heads = dflash_heads(target, num_layers=2, feature_layers=[1, 2])
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier=str(tmp_path / "target"))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["dflash_config"] == {"mask_token_id": MASK_ID, "target_layer_ids": [0, 1], "causal": False}
    assert config["layer_types"] == ["full_attention"] * 2 and config["num_hidden_layers"] == 2
    assert config["block_size"] == BLOCK and config["num_target_layers"] == 3 and "eagle_config" not in config
    tensors = load_file(str(out / "model.safetensors"))
    assert "layers.1.self_attn.q_norm.weight" in tensors and "fc.weight" in tensors and "hidden_norm.weight" in tensors
    assert not any(k.startswith(("model.", "embed_tokens", "lm_head")) or "mask" in k for k in tensors)
    assert "token_counts" not in tensors
    with pytest.raises(ExportError, match=r"serves exactly 3 \(got 5\)"):
        export_heads(tmp_path / "heads", tmp_path / "vllm5", "vllm", verifier=str(tmp_path / "target"), num_speculative_tokens=5)
    for fmt in ("sglang", "speculators"):
        with pytest.raises(ExportError):
            export_heads(tmp_path / "heads", tmp_path / fmt, fmt, verifier=str(tmp_path / "target"))


# -- importers: z-lab/SpecForge layout and speculators dflash ----------------------------------------
def _zlab_and_speculators_folders(tmp_path):
    """A dflash head, exported to the z-lab layout (what SpecForge writes), and the same weights in
    speculators' documented dflash layout (frozen embedding / LM head copies, model. prefix-free)."""
    import json

    from safetensors.torch import load_file, save_file

    from draftheads.export import export_heads

    target = tiny_target("llama", layers=3)
    target.save_pretrained(tmp_path / "target")
    torch.manual_seed(1)
    heads = dflash_heads(target, num_layers=2, feature_layers=[1, 2])
    heads.save_pretrained(tmp_path / "heads")
    zlab = export_heads(tmp_path / "heads", tmp_path / "zlab", "vllm", verifier=str(tmp_path / "target"))
    config = json.loads((zlab / "config.json").read_text())
    tensors = load_file(str(zlab / "model.safetensors"))
    spec = tmp_path / "spec"
    spec.mkdir()
    layer_cfg = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                        "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size")}
    (spec / "config.json").write_text(json.dumps({
        "architectures": ["DFlashSpeculator"], "speculators_model_type": "dflash", "speculators_version": "0.3.0",
        "transformer_layer_config": {**layer_cfg, "model_type": "qwen3", "num_hidden_layers": 2},
        "draft_vocab_size": config["vocab_size"], "block_size": BLOCK, "target_hidden_size": config["hidden_size"],
        "aux_hidden_state_layer_ids": [1, 2], "mask_token_id": MASK_ID, "sliding_window_non_causal": False,
        "speculators_config": {"algorithm": "dflash"},
    }))
    copies = {"embed_tokens.weight": target.get_input_embeddings().weight.detach().clone(),
              "lm_head.weight": target.get_output_embeddings().weight.detach().clone()}
    save_file({**tensors, **copies}, str(spec / "model.safetensors"))
    return target, heads, zlab, spec


def test_z_lab_and_speculators_dflash_checkpoints_import_to_the_same_heads(tmp_path):
    from draftheads.export.importers import detect_format, import_heads
    from draftheads.export.sources import read_source

    target, heads, zlab, spec = _zlab_and_speculators_folders(tmp_path)
    assert detect_format(read_source(zlab)) == "dflash" and detect_format(read_source(spec)) == "speculators-dflash"
    ids = torch.tensor([[5, 9, 33, 17, 4]])
    expected = dh.SpeculativeDecoder(target, heads).generate(ids, max_new_tokens=20, eos_token_id=[])
    for name, src in (("zlab", zlab), ("spec", spec)):
        out = import_heads(src, tmp_path / f"imported-{name}", target)
        loaded = dh.load_heads(out, target=target)
        assert loaded.feature_layers == [1, 2] and loaded.block_size == BLOCK and loaded.mask_token_id == MASK_ID
        for key, value in heads.state_dict().items():
            if key != "token_counts":
                assert torch.equal(value, loaded.state_dict()[key]), f"{name}: {key}"
        got = dh.SpeculativeDecoder(target, loaded).generate(ids, max_new_tokens=20, eos_token_id=[])
        assert torch.equal(got.sequences, expected.sequences) and got.accept_lengths == expected.accept_lengths


def test_dflash_checkpoints_draftheads_cannot_decode_exactly_are_refused_by_name(tmp_path):
    import json
    import shutil

    from draftheads.export.importers import import_heads

    target, _, zlab, spec = _zlab_and_speculators_folders(tmp_path)

    def variant(name, edit):
        folder = tmp_path / name
        shutil.copytree(zlab, folder)
        config = json.loads((folder / "config.json").read_text())
        edit(config, folder)
        (folder / "config.json").write_text(json.dumps(config))
        return folder

    sliding = variant("swa", lambda c, f: c.update(layer_types=["sliding_attention", "full_attention"], sliding_window=8))
    with pytest.raises(ValueError, match="sliding-window draft layers"):
        import_heads(sliding, tmp_path / "a", target)
    causal = variant("causal", lambda c, f: c["dflash_config"].update(causal=True))
    with pytest.raises(ValueError, match="causal draft layers"):
        import_heads(causal, tmp_path / "b", target)
    mask = variant("mask", lambda c, f: torch.save(torch.zeros(64), f / "mask_embedding.pt"))
    with pytest.raises(ValueError, match="mask_embedding.pt"):
        import_heads(mask, tmp_path / "c", target)
    final = variant("final", lambda c, f: c["dflash_config"].update(target_layer_ids=[1, 2]))  # feature 3 = L
    with pytest.raises(ValueError, match="final hidden state"):
        import_heads(final, tmp_path / "d", target)


def test_init_from_takes_the_folders_mask_and_refuses_another_block(tmp_path):
    from draftheads.train.loop import init_heads_from

    target = tiny_target("llama", layers=3)
    dflash_heads(target).save_pretrained(tmp_path / "heads")
    with pytest.raises(ValueError, match="heads.block_size: config has 6"):
        init_heads_from(dflash_heads(target, block_size=6), str(tmp_path / "heads"), target)
    loaded = init_heads_from(dflash_heads(target, mask_token_id=None, loss_gamma=2.0), str(tmp_path / "heads"), target)
    assert loaded.mask_token_id == MASK_ID and loaded.config.extra["loss_gamma"] == 2.0


def test_calibrate_measures_per_slot_acceptance_and_one_block_forward(trained):
    from draftheads.tune.calibrate import calibrate
    from draftheads.methods.dflash.search import block_accuracy_table

    _, target, heads, prompts, _, _ = trained
    seqs = [greedy_reference(target, prompts[i : i + 1], 24)[0] for i in range(2)]
    table = block_accuracy_table(target, heads, seqs, max_rank=4, skip_prompt=[prompts.shape[1]] * 2)
    assert table.shape == (BLOCK - 1, 4) and float(table[0, 0]) > 0.3  # seen continuations: slot 1 mostly right
    result = calibrate(target, heads, [prompts[i : i + 1] for i in range(2)], new_tokens=16, max_rank=4, max_nodes=8)
    assert len(set(v for d, v in result.draft_seconds.items() if d > 0)) == 1
    assert all(len(p) <= BLOCK - 1 for p in result.tree)
    # Their table holds greedy hit rates, not the chance of acceptance under sampling: no tree is
    # chosen for a sampling temperature from it.
    with pytest.raises(ValueError, match="greedy decoding only"):
        calibrate(target, heads, [prompts[:1]], new_tokens=8, max_rank=4, max_nodes=8, temperature=0.7)


def _greedy_path_loss(target, heads, seq, loss_mask, greedy_path: bool):
    from draftheads.methods.dflash.loss import DFlashLoss
    from draftheads.train.head_loss import LossBatch

    heads.config.extra["greedy_path"] = greedy_path
    with torch.no_grad():
        hidden, features, _ = TargetWithHeads(target, heads).target_outputs(seq)
        return DFlashLoss()(heads, LossBatch(seq, loss_mask=loss_mask, hidden=hidden, features=features,
                                             generator=torch.Generator().manual_seed(0)))


def _greedy_path_counts(target, heads, seq, loss_mask, greedy_path: bool):
    return _greedy_path_loss(target, heads, seq, loss_mask, greedy_path).count


def test_greedy_path_counts_a_slot_only_after_the_targets_own_tokens():
    """heads.greedy_path: slot k of a block counts only where the data's k-1 tokens after the
    anchor are the target's greedy tokens (verification accepts slot k only then). On the target's
    own greedy text nothing changes; on other text the counts are exactly the blocks on its path."""
    target = tiny_target("llama", layers=3)
    heads = dflash_heads(target, num_anchors=8)
    prompts = torch.randint(3, target.config.vocab_size, (3, 6), generator=torch.Generator().manual_seed(1))
    greedy = greedy_reference(target, prompts, 24)
    on_text = torch.zeros_like(greedy)
    on_text[:, prompts.shape[1] :] = 1  # anchors at the prompt's last token or later: every block on the path
    assert torch.equal(_greedy_path_counts(target, heads, greedy, on_text, True),
                       _greedy_path_counts(target, heads, greedy, on_text, False))

    text = torch.randint(3, target.config.vocab_size, (3, 30), generator=torch.Generator().manual_seed(2))
    everything = torch.ones_like(text)
    off = _greedy_path_counts(target, heads, text, everything, False)
    on = _greedy_path_counts(target, heads, text, everything, True)
    with torch.no_grad():
        follows = target(text).logits.argmax(-1)[:, :-1] == text[:, 1:]  # follows[:, p-1]: token p is greedy
    anchors, valid = draw_anchors(anchor_candidates(text, everything, everything, BLOCK), 8, torch.Generator().manual_seed(0))
    expected = torch.zeros(BLOCK - 1, dtype=torch.long)
    for row in range(text.shape[0]):
        for a in anchors[row][valid[row]].tolist():
            for slot in range(BLOCK - 1):  # slot index j predicts token a+j+1 after tokens a+1..a+j
                if bool(follows[row, a : a + slot].all()):
                    expected[slot] += 1
    assert on[0] == off[0] and torch.equal(on, expected) and int(on[1:].sum()) < int(off[1:].sum())


def test_a_step_scores_only_the_slots_its_tree_reads(trained):
    """The block runs whole, but the vocabulary-sized LM head scores only slots 1..depth of the
    tree (the root's row and deeper slots are never read), with the logits the whole block gives."""
    _, target, heads, prompts, _, _ = trained
    seq = greedy_reference(target, prompts[:1], 8)[0]
    with torch.no_grad():
        _, features, _ = TargetWithHeads(target, heads).target_outputs(seq[None])
    drafter = DFlashDrafter(heads, tree=[[0], [1], [0, 0]])
    drafter.start([seq[:6]], [features[0, :6]], SamplingParams(), None)
    rows = []
    hook = heads.target_lm_head().register_forward_hook(lambda m, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    try:
        (tree,) = drafter.propose([int(seq[6])], [3])
    finally:
        hook.remove()
    assert rows == [2], f"the LM head scored {rows} rows for a tree 2 deep"
    full = drafter.block_logits([int(seq[6])])[0]
    with torch.inference_mode():
        assert torch.allclose(drafter.scores([int(seq[6])], [2])[0], full[1:3], atol=1e-5)
    ranks = full[1:3].topk(2, dim=-1).indices
    assert tree.tokens[1:].tolist() == [int(ranks[0, 0]), int(ranks[0, 1]), int(ranks[1, 0])]


def test_greedy_path_weighs_each_slot_by_how_often_it_is_reached():
    """With greedy_path each slot's summed loss is divided by the number of blocks, not by its own
    (smaller) count: a deep slot reached by few blocks weighs as little as verification uses it."""
    target = tiny_target("llama", layers=3)
    heads = dflash_heads(target, num_anchors=8)
    text = torch.randint(3, target.config.vocab_size, (3, 30), generator=torch.Generator().manual_seed(2))
    out = _greedy_path_loss(target, heads, text, torch.ones_like(text), True)
    assert int(out.count[1]) < int(out.count[0])  # deep slots are reached by fewer blocks
    w = heads.slot_weights() * (out.count > 0)
    expected = (w * out.ce_sum / out.count[0]).sum() / w.sum()
    assert torch.allclose(out.loss, expected, rtol=1e-5)
