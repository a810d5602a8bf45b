"""EAGLE 3.1 options of EAGLE-3 heads (``heads.fc_norm``, ``heads.norm_output``), end to end.

What vLLM computes for these config keys (llama_eagle3.py; the docstring of heads/eagle.py): an
RMSNorm per captured layer before ``fc``, and the final norm's OUTPUT handed to the next draft step.
Checked here, with each option on alone and both together:
- the decoder's draft logits at depth 1 and 2 (per-sequence and batched proposers, top-k trees
  and drawn chains) equal the training graph's unrolled steps (`methods/eagle/loss.py`: `EagleLoss`) on the same inputs;
- the same logits equal a hand computation from the exported vLLM folder (tests/engine_reference.py,
  written from vLLM's layout, not from draftheads), and that comparison FAILS when the decoder
  skips either norm;
- greedy decoding equals ``generate``; export -> import is bit-exact; hand-written checkpoints import;
- what is still not computed (use_aux_norm, P-EAGLE or SGLang with these options) is refused by name.
``norm_before_fc`` (the third option) is checked the same way in tests/test_norm_before_fc.py.
"""
from __future__ import annotations

import json

import pytest
import torch

import draftheads as dh
from draftheads.config import ConfigError, HeadsSpec, config_from_dict
from draftheads.export import ExportError, export_heads, import_heads, read_heads
from draftheads.inference.sampling import SamplingParams
from draftheads.methods.eagle.loss import EagleLoss, _UnrolledBatch, _unroll_step
from draftheads.train.head_loss import LossBatch
from engine_reference import eagle3_forward, eagle3_fuse, read_folder
from inference_utils import greedy_reference, tiny_target
from test_export import eagle3_two_steps, full_vocab, hidden_states, randomize, target4
from test_import import LLAMA_CONFIG, eagle3_checkpoint, norm_w, write

OPTIONS = {
    "fc_norm": {"fc_norm": True, "norm_output": False},
    "norm_output": {"fc_norm": False, "norm_output": True},
    "both": {"fc_norm": True, "norm_output": True},
}
KW = dict(layer0="layers.0", later_norm="input_layernorm", norm_before_residual=False)


def heads31(target, options: dict, feature_layers=None, num_layers=1, seed=0, vocab=48):
    """EAGLE-3 heads with ``options``, every weight random (norm weights 1 + noise, so that a norm's
    weight matters), a draft vocabulary of ``vocab`` tokens."""
    heads = dh.Eagle3Head.for_target(target, num_heads=3, num_layers=num_layers, feature_layers=feature_layers,
                                     draft_vocab_size=vocab, **options)
    randomize(heads, seed)
    counts = torch.randint(0, 1000, (heads.config.vocab_size,), generator=torch.Generator().manual_seed(seed))
    heads.set_draft_vocab(counts)
    return heads.eval()


class Recorder:
    """Wraps a proposer's logits function; keeps every output (the draft logits of each depth)."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, []

    def __call__(self, state):
        out = self.fn(state)
        self.calls.append(out.detach().clone())
        return out


def decoder_logits(heads, prompts, feats, roots, *, batched: bool, params=SamplingParams(), seed=0):
    """The decoder's draft logits at depth 1 and 2 for each row (draft vocabulary), and the
    depth-1 token each row drafted (target id): a chain of 2 from `EagleDrafter`, one row at a
    time or every row at once; ``params`` drawing drafts makes it `draw_chain`'s."""
    gen = torch.Generator().manual_seed(seed)
    if batched:
        rows = dh.EagleDrafter(heads, total_tokens=3, depth=2, top_k=1)
        rec = rows._logits = Recorder(rows._logits)
        rows.start(prompts, feats, params, gen)
        trees = rows.propose(roots, [2] * len(roots))
        n = len(roots)
        depth1, depth2 = rec.calls[0].reshape(n, -1), rec.calls[1].reshape(n, -1)
        return list(depth1), list(depth2), [int(t.tokens[1]) for t in trees]
    d1s, d2s, toks = [], [], []
    for prompt, feat, root in zip(prompts, feats, roots):
        drafter = dh.EagleDrafter(heads, total_tokens=3, depth=2, top_k=1)
        rec = drafter._logits = Recorder(drafter._logits)
        drafter.start([prompt], [feat], params, gen)
        (tree,) = drafter.propose([root], [2])
        d1s.append(rec.calls[0].reshape(-1))
        d2s.append(rec.calls[1].reshape(-1))
        toks.append(int(tree.tokens[1]))
    return d1s, d2s, toks


def training_logits(heads, prompt, feat, root, drafted):
    """The training graph's (`EagleLoss`'s unrolled steps) logits of row m-1 at steps 0 and 1 on
    the sequence prompt + root + drafted: the same inputs the decoder's depth 1 and 2 read. Under
    autograd, as in training (the draft layer takes another code path without it)."""
    m = prompt.numel()
    ids = torch.cat([prompt, torch.tensor([root, drafted])])[None]
    batch = _UnrolledBatch(ids, None, None)
    later = torch.randn(batch.n - m, feat.shape[-1], dtype=feat.dtype)  # rows row m-1 never sees
    feats = torch.cat([feat, later])[None]
    state = past = None
    out = []
    for k in range(2):
        state, past = _unroll_step(heads, batch, k, feats, state, past)
        out.append(heads.logits(state[0, m - 1]).detach())
    assert state.requires_grad
    return out


@pytest.mark.parametrize("options", ["plain", *OPTIONS], ids=str)
@pytest.mark.parametrize("how", ["per_sequence", "batched", "drawn", "drawn_batched"])
def test_decoder_draft_logits_at_depth_1_and_2_equal_the_training_unroll(options, how):
    """float64, rows of different lengths (holes in the batched draft cache); "plain" = EAGLE-3
    without the options (no such check existed for it either)."""
    target = tiny_target("llama").double()
    heads = heads31(target, OPTIONS.get(options, {})).double()
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


def _decode_two_depths(heads, target, ids, m):
    """The decoder's depth-1/2 draft logits (target vocabulary) after the prompt ids[:m] with root ids[m]."""
    with torch.no_grad():
        hs = target(ids[None, :m], output_hidden_states=True).hidden_states
    feat = torch.cat([hs[i][0] for i in heads.feature_layers], -1)
    d1, d2, drafted = decoder_logits(heads, [ids[:m]], [feat], [int(ids[m])], batched=False)
    return full_vocab(heads, d1[0][None])[0], full_vocab(heads, d2[0][None])[0], drafted[0]


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
def test_decoder_logits_equal_vllms_forward_on_the_export_and_fail_without_the_norm(tmp_path, options, monkeypatch):
    """Depth 1: the prompt's positions with their fused features and next tokens, the root's row
    last; depth 2: one more row (the drafted token, the state depth 1 returned) attending to them.
    Both computed by engine_reference from the exported folder as vLLM reads it."""
    target = target4()
    heads = heads31(target, OPTIONS[options], feature_layers=[3, 1, 2], num_layers=2, vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier="org/target"))
    engine_cfg = {**cfg["transformer_layer_config"], "vocab_size": 256,  # vLLM's update_eagle3 copies these keys
                  "fc_norm": cfg["fc_norm"], "norm_output": cfg["norm_output"]}
    ids, hs = hidden_states(target, n=12)
    m = 9
    d1, d2, drafted = _decode_two_depths(heads, target, ids, m)

    def reference(engine_cfg):
        aux = torch.cat([hs[k][0] for k in cfg["eagle_aux_hidden_state_layer_ids"]], -1)[:m]  # vLLM: layer order
        emb = target.get_input_embeddings()
        nxt = torch.cat([ids[1:m], ids[m : m + 1]])  # the token after each position, the root last
        with torch.no_grad():
            fused = eagle3_fuse(engine_cfg, t, aux)
            l1, fed = eagle3_forward(engine_cfg, t, emb(nxt), fused, torch.arange(m), **KW)
            l2, _ = eagle3_forward(engine_cfg, t, emb(torch.cat([nxt, torch.tensor([drafted])])),
                                   torch.cat([fused, fed[m - 1 :]]), torch.arange(m + 1), **KW)
        return l1[m - 1], l2[m]

    r1, r2 = reference(engine_cfg)
    torch.testing.assert_close(d1, r1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(d2, r2, rtol=1e-4, atol=1e-5)
    # The comparison can fail: the decoder without the fc norms / without the post-norm feedback.
    if heads.fc_norm is not None:
        monkeypatch.setattr(heads, "fc_norm", None)
    else:
        monkeypatch.setattr(heads, "norm_output", False)
    s1, s2, _ = _decode_two_depths(heads, target, ids, m)
    inside = torch.isfinite(r1)
    differs = not torch.allclose(s2[inside], r2[inside], rtol=1e-3, atol=1e-3)
    if heads.fc_norm is None and OPTIONS[options]["fc_norm"]:
        differs = differs and not torch.allclose(s1[inside], r1[inside], rtol=1e-3, atol=1e-3)
    assert differs, f"{options}: skipping the norm at inference leaves the draft logits as vLLM computes them"


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
@pytest.mark.parametrize("tree", [{"total_tokens": 8, "depth": 3, "top_k": 2}, {"total_tokens": 4, "depth": 3, "top_k": 1}],
                         ids=["tree", "chain"])
def test_greedy_decoding_equals_generate(options, tree):
    target = tiny_target("llama").double()
    heads = heads31(target, OPTIONS[options]).double()
    gen = torch.Generator().manual_seed(2)
    batch = torch.randint(3, target.config.vocab_size, (2, 10), generator=gen)
    decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
    for ids in (batch[:1], batch):  # one sequence, and a batch (the batched proposer)
        out = decoder.generate(ids, max_new_tokens=20, temperature=0.0, eos_token_id=[])
        assert torch.equal(out.sequences, greedy_reference(target, ids, 20)), f"{options}: batch of {ids.shape[0]}"


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
def test_export_writes_the_keys_vllm_reads_and_import_is_bit_exact(tmp_path, fmt, options):
    target = target4()
    heads = heads31(target, OPTIONS[options], feature_layers=[1, 2, 3], num_layers=2, vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / fmt, fmt, verifier="org/target")
    cfg, t = read_folder(out)
    # Top-level keys: vLLM's speculators update_eagle3 copies fc_norm / norm_output onto the draft config.
    assert cfg["fc_norm"] is OPTIONS[options]["fc_norm"] and cfg["norm_output"] is OPTIONS[options]["norm_output"]
    assert cfg["norm_before_fc"] is False and cfg["norm_before_residual"] is False and "input_norm.weight" not in t
    norms = sorted(k for k in t if k.startswith("fc_norm."))
    assert norms == ([f"fc_norm.{j}.weight" for j in range(3)] if cfg["fc_norm"] else [])
    for j in range(3 if cfg["fc_norm"] else 0):
        assert torch.equal(t[f"fc_norm.{j}.weight"], heads.fc_norm[j].weight.detach())
    engine_cfg = {**cfg["transformer_layer_config"], "vocab_size": 256, "fc_norm": cfg["fc_norm"],
                  "norm_output": cfg["norm_output"]}
    l1, l2, m1, m2 = eagle3_two_steps(heads, target, engine_cfg, t, cfg["eagle_aux_hidden_state_layer_ids"], **KW)
    torch.testing.assert_close(m1, l1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m2, l2, rtol=1e-4, atol=1e-5)

    back = dh.load_heads(import_heads(out, tmp_path / "back", target), target=target)
    assert {k: back.config.extra.get(k, False) for k in ("fc_norm", "norm_output")} == OPTIONS[options]
    assert_same_heads_and_decoding(heads, back, target)


def assert_same_heads_and_decoding(heads, back, target) -> None:
    """``back`` (exported and imported again) holds ``heads``' tensors bit for bit (layer order =
    draftheads' order: nothing is permuted) and decodes what they decode, which is `generate`'s output."""
    mine, theirs = heads.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name
    prompt = hidden_states(target)[0][None, :8]
    a = dh.SpeculativeDecoder(target, heads).generate(prompt, max_new_tokens=16, temperature=0.0)
    b = dh.SpeculativeDecoder(target, back).generate(prompt, max_new_tokens=16, temperature=0.0)
    assert torch.equal(b.sequences, greedy_reference(target, prompt, 16))
    assert torch.equal(a.sequences, b.sequences) and a.accept_lengths == b.accept_lengths


def test_fc_norms_follow_fcs_columns_into_layer_order(tmp_path):
    """Heads fusing layers listed out of order: engine norm j is the norm of the j-th layer in layer order."""
    target = target4()
    heads = heads31(target, OPTIONS["both"], feature_layers=[3, 1, 2], vocab=100)
    heads.save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm", verifier="org/target"))
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    for j, i in enumerate([1, 2, 0]):  # layer 1 is draftheads' chunk 1, layer 2 chunk 2, layer 3 chunk 0
        assert torch.equal(t[f"fc_norm.{j}.weight"], heads.fc_norm[i].weight.detach())
    back = read_heads(tmp_path / "vllm", target)
    assert back.feature_layers == [1, 2, 3]
    ids, hs = hidden_states(target)
    with torch.no_grad():
        a = heads.fuse(torch.cat([hs[i][0] for i in heads.feature_layers], -1))
        b = back.fuse(torch.cat([hs[i][0] for i in back.feature_layers], -1))
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same sum in another order


# -- checkpoints written from the layout (not by draftheads' exporter) ------------------------------------
def eagle31_checkpoint(prefix0, fc_norm: bool, seed=0):
    raw = eagle3_checkpoint(prefix0, seed=seed)
    if fc_norm:
        raw.update({f"fc_norm.{j}.weight": norm_w() for j in range(3)})
    return raw


def speculators_config(**options):
    return {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": dict(LLAMA_CONFIG), "draft_vocab_size": 100, "target_hidden_size": 64,
            "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": [0, 1, 3], **options,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "x", "architectures": []}}}


@pytest.mark.parametrize("layout", ["speculators", "midlayer"])
@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
def test_hand_written_eagle31_checkpoints_import_and_compute_vllms_draft(tmp_path, layout, options):
    target = target4()
    opts = OPTIONS[options]
    if layout == "speculators":
        raw, cfg, captured = eagle31_checkpoint("layers.0", opts["fc_norm"], seed=1), speculators_config(**opts), [0, 1, 3]
        engine_cfg = {**LLAMA_CONFIG, "vocab_size": 256, **opts}
    else:  # vLLM's llama_eagle3 reads midlayer.* as layers.0.* and these keys from the top level
        raw = eagle31_checkpoint("midlayer", opts["fc_norm"])
        cfg = {**LLAMA_CONFIG, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 100, **opts,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
        captured, engine_cfg = [1, 2, 3], {**cfg, "vocab_size": 256}  # this layout's ids count "output of layer j"
    heads = read_heads(write(tmp_path / "ckpt", raw, cfg), target)
    assert {k: heads.config.extra.get(k, False) for k in ("fc_norm", "norm_output")} == opts
    kw = {**KW, "layer0": "layers.0" if layout == "speculators" else "midlayer"}
    l1, l2, m1, m2 = eagle3_two_steps(heads, target, engine_cfg, raw, captured, **kw)
    torch.testing.assert_close(m1, l1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m2, l2, rtol=1e-4, atol=1e-5)
    prompt = hidden_states(target)[0][None, :8]
    out = dh.SpeculativeDecoder(target, heads).generate(prompt, max_new_tokens=12, temperature=0.0)
    assert torch.equal(out.sequences, greedy_reference(target, prompt, 12))


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda raw, cfg: raw.pop("fc_norm.1.weight"), r"fc_norm set but fc_norm\.1\.weight missing"),
        (lambda raw, cfg: cfg.__setitem__("fc_norm", False), r"no place in draftheads' EAGLE-3 head: fc_norm\.0\.weight"),
        (lambda raw, cfg: cfg.__setitem__("use_aux_norm", True), "use_aux_norm set"),
        (lambda raw, cfg: cfg.__setitem__("norm_before_residual", True), "norm_before_residual set"),
    ],
)
def test_what_is_still_not_computed_is_refused_by_name(tmp_path, change, match):
    raw, cfg = eagle31_checkpoint("layers.0", True), speculators_config(fc_norm=True, norm_output=True)
    change(raw, cfg)
    with pytest.raises(ValueError, match=match):
        read_heads(write(tmp_path / "ckpt", raw, cfg), target4())


def test_a_peagle_checkpoint_with_eagle31_options_is_refused(tmp_path):
    raw = eagle3_checkpoint("layers.0")
    raw["mask_hidden"] = torch.randn(1, 1, 3 * 64)
    cfg = {**speculators_config(norm_output=True), "speculators_model_type": "peagle", "mask_token_id": 5}
    with pytest.raises(ValueError, match="norm_output set on a P-EAGLE checkpoint"):
        read_heads(write(tmp_path / "ckpt", raw, cfg), target4())


def test_sglang_export_is_refused_by_name(tmp_path):
    heads31(target4(), OPTIONS["norm_output"], feature_layers=[1, 2, 3], vocab=100).save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match=r"norm_output \(EAGLE 3.1\): SGLang"):
        export_heads(tmp_path / "heads", tmp_path / "out", "sglang", verifier="x")
    assert not (tmp_path / "out").exists()


# -- options, configs and old folders -------------------------------------------------------------------
def test_options_default_off_and_old_heads_folders_keep_loading(tmp_path):
    from draftheads.train.loop import build_heads

    target = tiny_target("llama")
    assert (HeadsSpec().fc_norm, HeadsSpec().norm_output) == (False, False)
    plain = build_heads(HeadsSpec(head_type="eagle3", num_heads=2, draft_vocab_size=48), target)
    assert plain.fc_norm is None and plain.norm_output is False
    on = build_heads(HeadsSpec(head_type="eagle3", num_heads=2, draft_vocab_size=48, fc_norm=True, norm_output=True), target)
    assert len(on.fc_norm) == len(on.feature_layers) and on.norm_output
    on.set_draft_vocab(torch.arange(target.config.vocab_size))
    back = dh.load_heads(on.save_pretrained(tmp_path / "on"), target=target)
    assert back.config.extra["fc_norm"] is True and back.norm_output and len(back.fc_norm) == len(on.feature_layers)
    # A folder saved before the options existed: no keys at all.
    old = heads31(target, {})
    old.config.extra.pop("fc_norm", None), old.config.extra.pop("norm_output", None)
    old.save_pretrained(tmp_path / "old")
    assert "fc_norm" not in json.loads((tmp_path / "old" / "config.json").read_text())["extra"]
    loaded = dh.load_heads(tmp_path / "old", target=target)
    assert loaded.fc_norm is None and loaded.norm_output is False
    feats = torch.randn(1, 4, old.fc.weight.shape[1])
    tokens = torch.randint(3, 60, (1, 4))
    with torch.no_grad():
        g, a = old.first_input(feats, tokens)
        torch.testing.assert_close(loaded.logits(loaded.run_layers(*loaded.first_input(feats, tokens), torch.arange(4)[None],
                                                                   torch.ones(1, 4, 4, dtype=torch.bool).tril())[0]),
                                   old.lm_head(old.norm(old.run_layers(g, a, torch.arange(4)[None],
                                                                       torch.ones(1, 4, 4, dtype=torch.bool).tril())[0])))


@pytest.mark.parametrize("head_type", ["medusa", "eagle", "peagle", "dflash"])
def test_other_head_types_refuse_the_options_by_name(head_type):
    with pytest.raises(ConfigError, match=rf"heads.norm_output is set .* {head_type} heads do not use it: it applies to eagle3 heads only"):
        config_from_dict({"heads": {"head_type": head_type, "norm_output": True}})


def test_peagle_heads_refuse_the_options_vllm_would_not_forward():
    with pytest.raises(ValueError, match="peagle heads do not take fc_norm"):
        dh.PEagleHead.for_target(tiny_target("llama"), mask_token_id=63, fc_norm=True)


def test_init_from_names_an_option_difference(tmp_path):
    from draftheads.train.loop import build_heads, init_heads_from

    target = tiny_target("llama")
    heads31(target, OPTIONS["fc_norm"]).save_pretrained(tmp_path / "h")
    spec = dict(head_type="eagle3", num_heads=2, draft_vocab_size=48)
    with pytest.raises(ValueError, match=r"heads.fc_norm: config has False, .* has True"):
        init_heads_from(build_heads(HeadsSpec(**spec), target), str(tmp_path / "h"), target)
    assert init_heads_from(build_heads(HeadsSpec(**spec, fc_norm=True), target), str(tmp_path / "h"), target).fc_norm is not None


@pytest.mark.parametrize("options", list(OPTIONS), ids=str)
def test_training_reaches_the_new_norms(options):
    target = tiny_target("llama")
    heads = heads31(target, OPTIONS[options]).train()
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[i] for i in heads.feature_layers], -1)
    out = EagleLoss()(heads, LossBatch(ids, hidden=hs[-1], features=feats))
    out.loss.backward()
    assert torch.isfinite(out.loss) and int(out.count.sum()) > 0
    if heads.fc_norm is not None:
        assert all(n.weight.grad is not None and bool(n.weight.grad.abs().sum() > 0) for n in heads.fc_norm)
    assert bool(heads.norm.weight.grad.abs().sum() > 0)
