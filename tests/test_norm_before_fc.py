"""``heads.norm_before_fc`` of EAGLE-3 heads, end to end (the third EAGLE 3.1-era option; the
other two are checked in tests/test_eagle31.py, whose helpers this file reuses).

What vLLM computes for the config key (vllm/model_executor/models/llama_eagle3.py,
``combine_hidden_states``): ONE RMSNorm ``input_norm`` [n*H] over the whole concatenated target
features, then ``fc_norm``'s per-layer norms when set, then ``fc``. The speculators trainer turns it
on by default together with ``norm_output``, so its checkpoints need it to import.

Norm weights here are drawn in 0.25..1.75: with weights near 1 an RMSNorm in front of a linear
layer whose output is normalised again (``hidden_norm``) changes almost nothing, and a decoder that
skipped it could still pass. Checked, with the option alone and with ``fc_norm`` + ``norm_output``:
- the decoder's draft logits at depth 1 and 2 (every proposer path) equal the training unroll;
- the same logits equal engine_reference's hand computation from the exported vLLM folder, and
  differ from it when the decoder skips the norm;
- greedy decoding equals ``generate``; export -> import is bit-exact; the norm's weight follows
  fc's columns into layer order when feature layers are listed out of order;
- a hand-written speculators checkpoint (norm_before_fc + norm_output) and a midlayer one import
  and compute the engine's draft; what is not computed is refused by name.
P-EAGLE heads take the option too (vLLM normalises their mask_hidden with the same norm): see
tests/test_peagle_norm_before_fc.py.
"""
from __future__ import annotations

import json

import pytest
import torch

import draftheads as dh
from draftheads.config import ConfigError, HeadsSpec, config_from_dict
from draftheads.export import ExportError, export_heads, import_heads, read_heads
from draftheads.inference.sampling import SamplingParams
from draftheads.methods.eagle.loss import EagleLoss
from draftheads.train.head_loss import LossBatch
from engine_reference import eagle3_forward, eagle3_fuse, read_folder
from inference_utils import greedy_reference, tiny_target
from test_eagle31 import (
    KW, _decode_two_depths, assert_same_heads_and_decoding, decoder_logits, heads31, speculators_config, training_logits,
)
from test_export import eagle3_two_steps, hidden_states, target4
from test_import import LLAMA_CONFIG, eagle3_checkpoint, write

FLAGS = ("norm_before_fc", "fc_norm", "norm_output")
OPTIONS = {
    "norm_before_fc": {"norm_before_fc": True, "fc_norm": False, "norm_output": False},
    "all": {"norm_before_fc": True, "fc_norm": True, "norm_output": True},
}


def far_from_one(shape, seed: int) -> torch.Tensor:
    return 0.25 + 1.5 * torch.rand(shape, generator=torch.Generator().manual_seed(seed))


def heads_nbf(target, options: dict, seed=0, **kw):
    """`heads31` with the new norm (and fc_norm's, when set) weighted far from 1."""
    heads = heads31(target, options, seed=seed, **kw)
    with torch.no_grad():
        heads.input_norm.weight.copy_(far_from_one(heads.input_norm.weight.shape, seed + 100))
        for j, norm in enumerate(heads.fc_norm or []):
            norm.weight.copy_(far_from_one(norm.weight.shape, seed + 200 + j))
    return heads


def flags_of(heads) -> dict:
    return {k: heads.config.extra.get(k, False) for k in FLAGS}


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
@pytest.mark.parametrize("how", ["per_sequence", "batched", "drawn", "drawn_batched"])
def test_decoder_draft_logits_at_depth_1_and_2_equal_the_training_unroll(options, how):
    target = tiny_target("llama").double()
    heads = heads_nbf(target, OPTIONS[options]).double()
    width = heads.fc.weight.shape[1]
    gen = torch.Generator().manual_seed(1)
    vocab = target.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=gen) for n in (5, 9, 3)]
    feats = [torch.randn(p.numel(), width, generator=gen, dtype=torch.float64) for p in prompts]
    roots = [int(r) for r in torch.randint(3, vocab, (len(prompts),), generator=gen)]
    params = SamplingParams(temperature=1.0, sample_drafts=True) if how.startswith("drawn") else SamplingParams()
    d1s, d2s, drafted = decoder_logits(heads, prompts, feats, roots, batched=how.endswith("batched"), params=params)
    for r, (prompt, feat, root) in enumerate(zip(prompts, feats, roots)):
        t1, t2 = training_logits(heads, prompt, feat, root, drafted[r])
        torch.testing.assert_close(d1s[r], t1, rtol=1e-9, atol=1e-9, msg=f"row {r}: depth 1")
        torch.testing.assert_close(d2s[r], t2, rtol=1e-9, atol=1e-9, msg=f"row {r}: depth 2")


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
def test_decoder_logits_equal_vllms_forward_on_the_export_and_fail_without_the_norm(tmp_path, options, monkeypatch):
    """Feature layers listed out of order: the exported input_norm weight must follow fc's columns."""
    target = target4()
    heads = heads_nbf(target, OPTIONS[options], feature_layers=[3, 1, 2], num_layers=2, vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier="org/target"))
    assert cfg["norm_before_fc"] is True and "input_norm.weight" in t
    engine_cfg = {**cfg["transformer_layer_config"], "vocab_size": 256, **{k: cfg[k] for k in FLAGS}}
    ids, hs = hidden_states(target, n=12)
    m = 9
    d1, d2, drafted = _decode_two_depths(heads, target, ids, m)
    aux = torch.cat([hs[k][0] for k in cfg["eagle_aux_hidden_state_layer_ids"]], -1)[:m]  # vLLM: layer order
    emb = target.get_input_embeddings()
    nxt = torch.cat([ids[1:m], ids[m : m + 1]])
    with torch.no_grad():
        fused = eagle3_fuse(engine_cfg, t, aux)
        l1, fed = eagle3_forward(engine_cfg, t, emb(nxt), fused, torch.arange(m), **KW)
        l2, _ = eagle3_forward(engine_cfg, t, emb(torch.cat([nxt, torch.tensor([drafted])])),
                               torch.cat([fused, fed[m - 1 :]]), torch.arange(m + 1), **KW)
    r1, r2 = l1[m - 1], l2[m]
    torch.testing.assert_close(d1, r1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(d2, r2, rtol=1e-4, atol=1e-5)
    # The comparison can fail: the decoder without the norm over the fused input.
    monkeypatch.setattr(heads, "input_norm", None)
    s1, s2, _ = _decode_two_depths(heads, target, ids, m)
    inside = torch.isfinite(r1)
    assert not torch.allclose(s1[inside], r1[inside], rtol=1e-3, atol=1e-3), "depth 1 unchanged without input_norm"
    assert not torch.allclose(s2[inside], r2[inside], rtol=1e-3, atol=1e-3), "depth 2 unchanged without input_norm"


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
@pytest.mark.parametrize("tree", [{"total_tokens": 8, "depth": 3, "top_k": 2}, {"total_tokens": 4, "depth": 3, "top_k": 1}],
                         ids=["tree", "chain"])
def test_greedy_decoding_equals_generate(options, tree):
    target = tiny_target("llama").double()
    heads = heads_nbf(target, OPTIONS[options]).double()
    batch = torch.randint(3, target.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(2))
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
    for ids in (batch[:1], batch):
        out = decoder.generate(ids, max_new_tokens=20, temperature=0.0, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, 20)), f"{options}: batch of {ids.shape[0]}"


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
def test_export_writes_the_key_and_tensor_vllm_reads_and_import_is_bit_exact(tmp_path, fmt, options):
    target = target4()
    heads = heads_nbf(target, OPTIONS[options], feature_layers=[1, 2, 3], num_layers=2, vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / fmt, fmt, verifier="org/target")
    cfg, t = read_folder(out)
    # Top-level key: vLLM's update_eagle3 copies norm_before_fc onto the draft config; its tensor is
    # input_norm.weight (load_weights prefixes "model."; without the flag vLLM drops the name).
    assert {k: cfg[k] for k in FLAGS} == OPTIONS[options]
    assert "norm_before_fc" not in cfg["transformer_layer_config"]["eagle_config"]  # read there first
    assert torch.equal(t["input_norm.weight"], heads.input_norm.weight.detach())  # layer order = listed order
    engine_cfg = {**cfg["transformer_layer_config"], "vocab_size": 256, **{k: cfg[k] for k in FLAGS}}
    l1, l2, m1, m2 = eagle3_two_steps(heads, target, engine_cfg, t, cfg["eagle_aux_hidden_state_layer_ids"], **KW)
    torch.testing.assert_close(m1, l1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m2, l2, rtol=1e-4, atol=1e-5)

    back = dh.load_heads(import_heads(out, tmp_path / "back", target), target=target)
    assert flags_of(back) == OPTIONS[options]
    assert "input_norm.weight" in heads.state_dict()
    assert_same_heads_and_decoding(heads, back, target)


def test_the_norm_weight_follows_fcs_columns_into_layer_order(tmp_path):
    target = target4()
    heads = heads_nbf(target, OPTIONS["all"], feature_layers=[3, 1, 2], vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier="org/target"))
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    w, d = heads.input_norm.weight.detach(), heads.config.hidden_size
    for j, i in enumerate([1, 2, 0]):  # layer 1 is draftheads' chunk 1, layer 2 chunk 2, layer 3 chunk 0
        assert torch.equal(t["input_norm.weight"][j * d : (j + 1) * d], w[i * d : (i + 1) * d])
    back = read_heads(tmp_path / "vllm", target)
    assert back.feature_layers == [1, 2, 3]
    _, hs = hidden_states(target)
    with torch.no_grad():
        a = heads.fuse(torch.cat([hs[i][0] for i in heads.feature_layers], -1))
        b = back.fuse(torch.cat([hs[i][0] for i in back.feature_layers], -1))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# -- checkpoints written from the layout (not by draftheads' exporter) ------------------------------------
def nbf_checkpoint(prefix0, seed=0):
    raw = eagle3_checkpoint(prefix0, seed=seed)
    raw["input_norm.weight"] = far_from_one(3 * 64, seed + 7)
    return raw


@pytest.mark.parametrize("layout", ["speculators", "midlayer"])
def test_hand_written_checkpoints_with_norm_before_fc_import_and_compute_vllms_draft(tmp_path, layout, monkeypatch):
    """speculators: the speculators trainer's defaults (norm_before_fc + norm_output, top level);
    midlayer: norm_before_fc in eagle_config, where vLLM's llama_eagle3 reads it first."""
    target = target4()
    opts = {"norm_before_fc": True, "fc_norm": False, "norm_output": True}
    if layout == "speculators":
        raw, captured = nbf_checkpoint("layers.0", seed=1), [0, 1, 3]
        cfg = speculators_config(norm_before_fc=True, norm_output=True)
        engine_cfg = {**LLAMA_CONFIG, "vocab_size": 256, **opts}
        kw = KW
    else:
        opts["norm_output"] = False
        raw, captured = nbf_checkpoint("midlayer"), [1, 2, 3]  # this layout's ids count "output of layer j"
        cfg = {**LLAMA_CONFIG, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 100,
               "norm_before_fc": False,  # overridden by eagle_config's, as in vLLM
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "norm_before_fc": True}}
        engine_cfg = {**cfg, "vocab_size": 256, **opts}
        kw = {**KW, "layer0": "midlayer"}
    heads = read_heads(write(tmp_path / "ckpt", raw, cfg), target)
    assert flags_of(heads) == opts
    l1, l2, m1, m2 = eagle3_two_steps(heads, target, engine_cfg, raw, captured, **kw)
    torch.testing.assert_close(m1, l1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m2, l2, rtol=1e-4, atol=1e-5)
    prompt = hidden_states(target)[0][None, :8]
    out = dh.SpeculativeDecoder(target, heads).generate(prompt, max_new_tokens=12, temperature=0.0)
    assert torch.equal(out.sequences, greedy_reference(target, prompt, 12))
    monkeypatch.setattr(heads, "input_norm", None)  # the reference can tell: without the norm it differs
    _, _, s1, _ = eagle3_two_steps(heads, target, engine_cfg, raw, captured, **kw)
    inside = torch.isfinite(l1)
    assert not torch.allclose(s1[inside], l1[inside], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda raw, cfg: raw.pop("input_norm.weight"), r"norm_before_fc set but input_norm\.weight missing"),
        (lambda raw, cfg: cfg.__setitem__("norm_before_fc", False), r"no place in draftheads' EAGLE-3 head: input_norm\.weight"),
        (lambda raw, cfg: cfg.__setitem__("use_aux_norm", True), "use_aux_norm set"),
    ],
)
def test_what_is_still_not_computed_is_refused_by_name(tmp_path, change, match):
    raw, cfg = nbf_checkpoint("layers.0"), speculators_config(norm_before_fc=True, norm_output=True)
    change(raw, cfg)
    with pytest.raises(ValueError, match=match):
        read_heads(write(tmp_path / "ckpt", raw, cfg), target4())


def test_sglang_export_refuses_it_by_name(tmp_path):
    """(P-EAGLE heads take norm_before_fc since vLLM normalises mask_hidden with it too: tests/test_peagle_norm_before_fc.py)"""
    heads_nbf(target4(), OPTIONS["norm_before_fc"], feature_layers=[1, 2, 3], vocab=100).save_pretrained(tmp_path / "h")
    with pytest.raises(ExportError, match=r"norm_before_fc \(EAGLE 3.1\): SGLang"):
        export_heads(tmp_path / "h", tmp_path / "out", "sglang", verifier="x")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("head_type", ["medusa", "eagle", "dflash"])
def test_other_head_types_refuse_it_by_name(head_type):
    with pytest.raises(ConfigError, match=rf"heads.norm_before_fc is set .* {head_type} heads do not use it: it applies to eagle3, peagle heads only"):
        config_from_dict({"heads": {"head_type": head_type, "norm_before_fc": True}})


def test_default_off_and_old_heads_folders_keep_loading(tmp_path):
    from draftheads.train.loop import build_heads, init_heads_from

    target = tiny_target("llama")
    assert HeadsSpec().norm_before_fc is False
    spec = dict(head_type="eagle3", num_heads=2, draft_vocab_size=48)
    assert build_heads(HeadsSpec(**spec), target).input_norm is None
    on = build_heads(HeadsSpec(**spec, norm_before_fc=True), target)
    assert tuple(on.input_norm.weight.shape) == (on.fc.weight.shape[1],)
    on.set_draft_vocab(torch.arange(target.config.vocab_size))
    back = dh.load_heads(on.save_pretrained(tmp_path / "on"), target=target)
    assert back.config.extra["norm_before_fc"] is True and back.input_norm is not None
    old = heads31(target, {})
    old.config.extra.pop("norm_before_fc", None)
    old.save_pretrained(tmp_path / "old")
    assert "norm_before_fc" not in json.loads((tmp_path / "old" / "config.json").read_text())["extra"]
    assert dh.load_heads(tmp_path / "old", target=target).input_norm is None
    with pytest.raises(ValueError, match=r"heads.norm_before_fc: config has True, .* has None"):
        init_heads_from(build_heads(HeadsSpec(**spec, norm_before_fc=True), target), str(tmp_path / "old"), target)
    with pytest.raises(ValueError, match="eagle3 norm_before_fc must be true or false"):
        dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=48, norm_before_fc="yes")


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
def test_training_reaches_the_new_norm(options):
    target = tiny_target("llama")
    heads = heads_nbf(target, OPTIONS[options]).train()
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i] for i in heads.feature_layers], -1)
    out = EagleLoss()(heads, LossBatch(ids, hidden=hs[-1], features=feats))
    out.loss.backward()
    assert torch.isfinite(out.loss) and int(out.count.sum()) > 0
    assert heads.input_norm.weight.grad is not None and bool(heads.input_norm.weight.grad.abs().sum() > 0)
