"""``heads.norm_before_fc`` on P-EAGLE heads (EAGLE-3 heads: tests/test_norm_before_fc.py).

What vLLM 0.32 computes for a speculators ``peagle`` folder with ``norm_before_fc`` (served as
``eagle3`` + ``parallel_drafting``): the committed positions' captured states go through
``combine_hidden_states`` = fc(input_norm(x)) (v1/spec_decode/llm_base_proposer.py:549-552,
model_executor/models/llama_eagle3.py:397-418); the mask slots' hidden state is
``combine_hidden_states(mask_hidden)``, computed once at load (llm_base_proposer.py:1401-1414) and
written over those slots after the fusion (llm_base_proposer.py:920-930). So mask_hidden goes
through the same input_norm, then fc, exactly like a real feature; draftheads' `PEagleHead.mask_input`
computes ``fuse(mask_hidden)``, the same. (The speculators trainer's P-EAGLE forward substitutes
mask_hidden before its input_norm and fc too.)

Norm weights are drawn in 0.25..1.75 so that the norm matters. Checked: the config takes the option
for peagle (fc_norm / norm_output stay refused); the mask state is fc(input_norm(mask_hidden)); the
training elements equal drafting's; draftheads' draft logits equal engine_reference's hand computation
of vLLM's parallel drafting on the exported folder (and a mask state that skipped the norm would
differ); trained heads decode exactly what ``generate`` does (chain, tree, padded batch); export ->
import is bit-exact; a hand-written speculators peagle checkpoint with norm_before_fc imports and
computes vLLM's draft.
"""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.config import ConfigError, HeadsSpec, config_from_dict
from draftheads.export import export_heads, import_heads, read_heads
from draftheads.inference.sampling import SamplingParams
from draftheads.methods.peagle.search import draft_scores
from engine_reference import peagle_draft_logits, read_folder, rms
from inference_utils import greedy_reference, tiny_target
from test_batch import check_rows_exact
from test_eagle31 import KW, speculators_config
from test_export import hidden_states, randomize, target4
from test_import import write
from test_norm_before_fc import far_from_one, nbf_checkpoint
from test_peagle import DEPTHS, MASK, TREE, check_training_elements_equal_drafting, trained_peagle


def far_norm(heads, seed: int = 100) -> None:
    with torch.no_grad():
        heads.input_norm.weight.copy_(far_from_one(heads.input_norm.weight.shape, seed))


def nbf_peagle(target, feature_layers=None, num_layers=1, vocab=48, seed=0):
    """Random P-EAGLE heads with norm_before_fc, input_norm weighted far from 1, mask token MASK."""
    heads = dh.PEagleHead.for_target(target, num_heads=DEPTHS, num_layers=num_layers, draft_vocab_size=vocab,
                                     mask_token_id=MASK, feature_layers=feature_layers, norm_before_fc=True)
    randomize(heads, seed)
    far_norm(heads, seed + 100)
    counts = torch.randint(1, 1000, (heads.config.vocab_size,), generator=torch.Generator().manual_seed(seed))
    counts[MASK] = 0
    heads.set_draft_vocab(counts)
    return heads.eval()


def test_the_config_takes_it_for_peagle_and_still_refuses_the_other_eagle31_options(tmp_path):
    from draftheads.train.loop import build_heads

    config_from_dict({"heads": {"head_type": "peagle", "norm_before_fc": True}})
    for key in ("fc_norm", "norm_output"):
        with pytest.raises(ConfigError, match=rf"heads.{key} is set .* peagle heads do not use it"):
            config_from_dict({"heads": {"head_type": "peagle", key: True}})
        with pytest.raises(ValueError, match=rf"peagle heads do not take {key}"):
            dh.PEagleHead.for_target(tiny_target("llama"), mask_token_id=MASK, **{key: True})
    target = tiny_target("llama")
    spec = dict(head_type="peagle", num_heads=3, draft_vocab_size=16, mask_token_id=MASK)
    assert build_heads(HeadsSpec(**spec), target).input_norm is None
    heads = build_heads(HeadsSpec(**spec, norm_before_fc=True), target)
    assert heads.config.extra["norm_before_fc"] is True
    assert tuple(heads.input_norm.weight.shape) == (heads.fc.weight.shape[1],) == (heads.mask_hidden.shape[-1],)
    heads.set_draft_vocab(torch.arange(64).index_fill(0, torch.tensor([MASK]), 0))
    back = dh.load_heads(heads.save_pretrained(tmp_path / "h"), target=target)
    assert type(back) is dh.PEagleHead and back.config.extra["norm_before_fc"] is True and back.input_norm is not None


def test_the_mask_state_is_fc_of_input_norm_of_mask_hidden():
    heads = nbf_peagle(tiny_target("llama"))
    eps = heads.config.extra["rms_norm_eps"]
    with torch.no_grad():
        g, _ = heads.mask_input((2, 3))
        m = heads.mask_hidden.reshape(-1)
        expected = rms(m, heads.input_norm.weight, eps) @ heads.fc.weight.T
        skipped = m @ heads.fc.weight.T
    assert g.shape == (2, 3, heads.config.hidden_size)
    torch.testing.assert_close(g[1, 2], expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(g[0, 0], skipped, rtol=1e-2, atol=1e-3)


def test_training_elements_compute_what_drafting_computes():
    """test_peagle's element-by-element check, with the norm over real and mask features alike."""
    target = tiny_target("llama", seed=1)
    heads = nbf_peagle(target, num_layers=2, seed=3)
    check_training_elements_equal_drafting(heads, target)


def _vllm_and_draftheads(heads, target, cfg, t, m, **ref_kw):
    """(engine_reference's logits of vLLM's parallel drafting [DEPTHS, draft vocab], draftheads'
    draft_scores) after committing positions 0..m-1 of a prompt, root = token m."""
    ids, hs = hidden_states(target, n=12)
    aux = torch.cat([hs[k][0] for k in cfg["eagle_aux_hidden_state_layer_ids"]], -1)[:m]  # vLLM: layer order
    feats = torch.cat([hs[i][0] for i in heads.feature_layers], -1)[:m]  # draftheads' order
    engine_cfg = {**cfg["transformer_layer_config"], "vocab_size": heads.config.vocab_size,
                  "norm_before_fc": cfg["norm_before_fc"], "mask_token_id": cfg["mask_token_id"]}
    with torch.no_grad():
        ref = peagle_draft_logits(engine_cfg, t, aux, ids[1 : m + 1], DEPTHS, **ref_kw, **KW)
    drafter = heads.proposer()
    drafter.start([ids[:m]], [feats], SamplingParams(), None)
    mine = draft_scores(drafter, int(ids[m]), DEPTHS)
    return ref[:, heads.vocab_ids()], mine


def test_draft_logits_equal_vllms_parallel_drafting_on_the_export(tmp_path):
    """Feature layers listed out of order: input_norm's weight and mask_hidden follow fc's columns.
    Depth 1 (the root's slot) never sees the mask slots; depths 2.. read the mask state, and a mask
    state that skipped input_norm (fc(mask_hidden)) would give other logits there."""
    target = target4()
    heads = nbf_peagle(target, feature_layers=[3, 1, 2], num_layers=2, vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "spec", "speculators", verifier="org/target")
    cfg, t = read_folder(out)
    assert cfg["speculators_model_type"] == "peagle" and cfg["norm_before_fc"] is True
    assert "fc_norm" not in cfg and "norm_output" not in cfg and "input_norm.weight" in t
    for m in (1, 5, 9):
        ref, mine = _vllm_and_draftheads(heads, target, cfg, t, m)
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-5, msg=f"{m} committed positions")
        unnormed, _ = _vllm_and_draftheads(heads, target, cfg, t, m, mask_hidden_normed=False)
        torch.testing.assert_close(unnormed[0], ref[0], rtol=1e-5, atol=1e-6)
        for d in range(1, DEPTHS):
            assert not torch.allclose(unnormed[d], ref[d], rtol=1e-3, atol=1e-3), f"depth {d + 1}: the norm is invisible"


@pytest.fixture(scope="module")
def trained_nbf():
    target = tiny_target("llama")
    heads, prompts, first, last = trained_peagle(target, prepare=far_norm, norm_before_fc=True)
    return target, heads, prompts, first, last


@pytest.mark.parametrize("tree", [None, TREE], ids=["chain", "tree"])
def test_trained_heads_decode_greedy_exactly(trained_nbf, tree):
    target, heads, prompts, first, last = trained_nbf
    assert last < first - 1e-3, f"loss did not decrease ({first:.4f} -> {last:.4f})"
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
    accepted = 0
    for i, new in enumerate((40, 40, 7, 1)):
        ids = prompts[i : i + 1]
        out = decoder.generate(ids, max_new_tokens=new, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, new)), f"prompt {i}: output differs from generate"
        accepted += sum(out.accept_lengths) - len(out.accept_lengths)
    assert accepted > 10, f"only {accepted} drafts accepted: the check would be vacuous"


def test_trained_heads_decode_a_left_padded_batch_exactly(trained_nbf):
    target, heads, prompts, _, _ = trained_nbf
    rows = [prompts[0].tolist(), prompts[1, 2:].tolist(), prompts[2].tolist() + [7, 9, 11], [1, 20, 33, 40, 5]]
    check_rows_exact(target, heads, rows)


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_export_import_round_trip_is_bit_exact(tmp_path, fmt):
    target = target4()
    heads = nbf_peagle(target, feature_layers=[1, 2, 3], num_layers=2, vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / fmt, fmt, verifier="org/target")
    cfg, t = read_folder(out)
    assert cfg["norm_before_fc"] is True and torch.equal(t["input_norm.weight"], heads.input_norm.weight.detach())
    back = dh.load_heads(import_heads(out, tmp_path / "back", target), target=target)
    assert type(back) is dh.PEagleHead and back.config.extra["norm_before_fc"] is True
    assert not back.config.extra.get("fc_norm") and not back.config.extra.get("norm_output")
    mine, theirs = heads.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        if name != "token_counts":  # not exported (the import starts from zeros)
            assert torch.equal(mine[name], theirs[name]), name
    prompt = hidden_states(target)[0][None, :8]
    a = dh.SpeculativeDecoder(target, heads).generate(prompt, max_new_tokens=16, temperature=0.0, eos_token_id=[])
    b = dh.SpeculativeDecoder(target, back).generate(prompt, max_new_tokens=16, temperature=0.0, eos_token_id=[])
    assert torch.equal(b.sequences, greedy_reference(target, prompt, 16))
    assert torch.equal(a.sequences, b.sequences) and a.accept_lengths == b.accept_lengths


def peagle_checkpoint(seed=0):
    """A speculators peagle folder as the speculators trainer writes one with norm_before_fc."""
    raw = nbf_checkpoint("layers.0", seed=seed)
    g = torch.Generator().manual_seed(seed + 11)
    raw["mask_hidden"] = torch.randn(1, 1, 3 * 64, generator=g)
    raw["embed_tokens.weight"] = torch.randn(256, 64, generator=g) * 0.1
    cfg = {**speculators_config(norm_before_fc=True), "speculators_model_type": "peagle", "mask_token_id": 5,
           "architectures": ["PEagleSpeculator"]}
    cfg["speculators_config"] = {**cfg["speculators_config"], "algorithm": "peagle",
                                 "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": DEPTHS}]}
    return raw, cfg


def test_a_hand_written_speculators_peagle_checkpoint_with_norm_before_fc_imports_and_computes_vllms_draft(tmp_path):
    target = target4()
    raw, cfg = peagle_checkpoint()
    heads = read_heads(write(tmp_path / "ckpt", raw, cfg), target)
    assert type(heads) is dh.PEagleHead and heads.config.extra["norm_before_fc"] is True
    assert heads.mask_token_id == 5 and heads.config.num_heads == DEPTHS
    assert torch.equal(heads.input_norm.weight.detach(), raw["input_norm.weight"])
    cfg_seen = {**cfg, "transformer_layer_config": {**cfg["transformer_layer_config"]}}
    for m in (1, 6):
        ref, mine = _vllm_and_draftheads(heads, target, cfg_seen, raw, m)
        torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-5, msg=f"{m} committed positions")
    prompt = hidden_states(target)[0][None, :8]
    out = dh.SpeculativeDecoder(target, heads).generate(prompt, max_new_tokens=12, temperature=0.0, eos_token_id=[])
    assert torch.equal(out.sequences, greedy_reference(target, prompt, 12))


@pytest.mark.parametrize("key", ["norm_output", "fc_norm"])
def test_a_peagle_checkpoint_with_the_unforwarded_options_is_still_refused(tmp_path, key):
    raw, cfg = peagle_checkpoint()
    cfg[key] = True
    with pytest.raises(ValueError, match=rf"{key} set on a P-EAGLE checkpoint"):
        read_heads(write(tmp_path / "ckpt", raw, cfg), target4())
