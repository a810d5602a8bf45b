"""Exports to vLLM / SGLang / speculators: names, shapes and config keys as the engines read them,
and the SAME draft function as draftheads' heads, checked against engine forwards written from the
documented layouts (tests/engine_reference.py), not against the exporter's own code."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import draftheads as dh
from conftest import make_tiny_model
from draftheads.export import ExportError, export_heads
from inference_utils import select_features
from engine_reference import eagle1_forward, eagle3_forward, eagle3_fuse, medusa_logits, read_folder


def target4():
    return make_tiny_model("llama", num_hidden_layers=4)


def randomize(heads: torch.nn.Module, seed: int = 0, std: float = 0.1) -> torch.nn.Module:
    """Random weights everywhere (fresh heads start as identities, which would hide wiring mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if p.ndim == 1 else 0.0))
    return heads


def eagle3_heads(target, feature_layers, num_layers=1, vocab=100, seed=0):
    heads = dh.Eagle3Head.for_target(target, feature_layers=feature_layers, draft_vocab_size=vocab, num_layers=num_layers)
    randomize(heads, seed)
    counts = torch.randint(0, 1000, (heads.config.vocab_size,), generator=torch.Generator().manual_seed(seed))
    heads.set_draft_vocab(counts)
    return heads


def hidden_states(target, n=12, seed=1):
    ids = torch.randint(4, target.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return ids[0], target(ids, output_hidden_states=True).hidden_states


def causal(n):
    return torch.ones(n, n, dtype=torch.bool).tril()[None]


def full_vocab(heads, logits):
    ids = heads.vocab_ids()
    if ids is None:
        return logits
    full = torch.full((logits.shape[0], heads.config.vocab_size), float("-inf"))
    full[:, ids] = logits
    return full


@torch.no_grad()
def draftheads_two_steps(heads, feats, tokens1, tokens2):
    """Step 1 from target features, step 2 from step 1's output (what drafting feeds back)."""
    n = tokens1.numel()
    pos = torch.arange(n)[None]
    g, a = heads.first_input(feats[None], tokens1[None])
    s1, _ = heads.run_layers(g, a, pos, causal(n))
    g, a = heads.next_input(s1, tokens2[None])
    s2, _ = heads.run_layers(g, a, pos, causal(n))
    return [full_vocab(heads, heads.logits(s[0])) for s in (s1, s2)]


def eagle3_two_steps(heads, target, layer_cfg, t, captured, **kw):
    """Logits of two EAGLE-3 draft steps, (engine step 1, engine step 2, draftheads step 1,
    draftheads step 2): the engine's forward (engine_reference) over an exported/imported folder's
    tensors ``t``, reading the hidden states ``captured`` (indices into output_hidden_states, in the
    engine's concatenation order), and draftheads' own heads. ``layer_cfg`` is the draft config as
    the engine sees it (EAGLE 3.1's ``fc_norm`` / ``norm_output`` included when set)."""
    ids, hs = hidden_states(target)
    aux = torch.cat([hs[k][0] for k in captured], -1)[:-2]
    feats = select_features(hs, heads.feature_layers)[0][:-2]  # draftheads' order
    tok1, tok2 = ids[1:-1], ids[2:]
    pos, emb = torch.arange(tok1.numel()), target.get_input_embeddings()
    with torch.no_grad():
        l1, x1 = eagle3_forward(layer_cfg, t, emb(tok1), eagle3_fuse(layer_cfg, t, aux), pos, **kw)
        l2, _ = eagle3_forward(layer_cfg, t, emb(tok2), x1, pos, **kw)  # what step 1 returns is fed back
    m1, m2 = draftheads_two_steps(heads, feats, tok1, tok2)
    return l1, l2, m1, m2


# -- Medusa -> vLLM -----------------------------------------------------------------------------------
@pytest.mark.parametrize("lm_head", ["own", "shared"])
def test_medusa_vllm_layout_and_function(tmp_path, tiny_target_dir, lm_head):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir).eval()
    heads = randomize(dh.MedusaHeads.for_target(target, num_heads=3, num_layers=2, lm_head=lm_head))
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm")  # verifier: the recorded target folder
    cfg, t = read_folder(out)
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert (cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (3, 2, 64, 256)
    assert cfg["medusa_fc_bias"] is True  # draftheads' blocks have biases: without this vLLM ignores them
    assert cfg["original_lm_head"] is (lm_head == "shared")
    lm_names = sorted(k for k in t if k.startswith("lm_heads."))
    assert lm_names == (["lm_heads.0.weight"] if lm_head == "shared" else [f"lm_heads.{h}.weight" for h in range(3)])
    if lm_head == "shared":
        assert torch.equal(t["lm_heads.0.weight"], target.lm_head.weight)
    assert {k for k in t if k.startswith("blocks.")} == {
        f"blocks.{h}.layers.{l}.{w}" for h in range(3) for l in range(2) for w in ("weight", "bias")}

    hidden = hidden_states(target)[1][-1][0]
    with torch.no_grad():
        mine = [heads.project(s, k) for k, s in enumerate(heads.head_states(hidden))]
    for k, ref in enumerate(medusa_logits(cfg, t, hidden)):
        torch.testing.assert_close(ref, mine[k], rtol=1e-5, atol=1e-5)


def test_medusa_shared_lm_head_needs_a_target_folder(tmp_path):
    target = make_tiny_model("llama")
    heads = dh.MedusaHeads.for_target(target, num_heads=2, lm_head="shared")
    heads.save_pretrained(tmp_path / "heads")  # recorded name_or_path: none (built in memory)
    with pytest.raises(ExportError, match="--verifier"):
        export_heads(tmp_path / "heads", tmp_path / "out", "vllm")
    assert not (tmp_path / "out").exists()


def test_medusa_shared_lm_head_refuses_another_targets_head(tmp_path, tiny_target_dir):
    other = make_tiny_model("llama", seed=5)
    heads = dh.MedusaHeads.for_target(other, num_heads=2, lm_head="shared")
    heads.save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match="not the one these heads were trained with"):
        export_heads(tmp_path / "heads", tmp_path / "out", "vllm", verifier=str(tiny_target_dir))


# -- EAGLE -> vLLM EAGLE-1 and SGLang EAGLE -----------------------------------------------------------
@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_eagle_layout_and_function(tmp_path, fmt):
    target = target4()
    heads = randomize(dh.EagleHead.for_target(target, num_layers=2))
    assert heads.fc.bias is None  # new heads: no fc bias (vLLM's EAGLE-1 has none)
    heads.save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / fmt, fmt))
    assert cfg["architectures"] == (["LlamaForCausalLM"] if fmt == "vllm" else ["LlamaForCausalLMEagle"])
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 2 and cfg["tie_word_embeddings"] is False
    assert "layers.0.input_layernorm.weight" not in t and "layers.1.input_layernorm.weight" in t
    assert not any(k.startswith(("embed_tokens", "lm_head", "norm")) for k in t)  # the target's; no final norm
    if fmt == "vllm":
        assert "fc.bias" not in t
    else:  # SGLang's fc always has a bias: an absent one would keep its random init
        assert torch.equal(t["fc.bias"], torch.zeros(64))

    ids, hs = hidden_states(target)
    feats, emb, lm = hs[-1][0][:-2], target.get_input_embeddings(), target.get_output_embeddings()
    tok1, tok2 = ids[1:-1], ids[2:]
    pos = torch.arange(tok1.numel())
    with torch.no_grad():
        x1 = eagle1_forward(cfg, t, emb(tok1), feats, pos, fc_bias=fmt == "sglang")
        x2 = eagle1_forward(cfg, t, emb(tok2), x1, pos, fc_bias=fmt == "sglang")
        ref = [lm(x1), lm(x2)]
    mine = draftheads_two_steps(heads, feats, tok1, tok2)
    for r, m in zip(ref, mine):
        torch.testing.assert_close(r, m, rtol=1e-5, atol=1e-5)


def test_eagle_fc_bias_is_refused_by_vllm_and_kept_by_sglang(tmp_path):
    target = target4()
    heads = randomize(dh.EagleHead.for_target(target, fc_bias=True))
    assert heads.fc.bias is not None and bool((heads.fc.bias != 0).any())
    heads.save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match=r"fc\.bias: vLLM's EAGLE-1 draft has no place for it"):
        export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm")
    assert not (tmp_path / "vllm").exists()
    _, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "sglang", "sglang"))
    assert torch.equal(t["fc.bias"], heads.fc.bias.detach())

    zero = dh.EagleHead.for_target(target, fc_bias=True)  # an exactly-zero bias changes nothing: dropped
    zero.save_pretrained(tmp_path / "zero")
    assert "fc.bias" not in read_folder(export_heads(tmp_path / "zero", tmp_path / "zero-vllm", "vllm"))[1]


def test_fc_bias_option_defaults_off_and_old_heads_still_load(tmp_path):
    from draftheads.config import HeadsSpec
    from draftheads.train.loop import build_heads

    target = target4()
    assert HeadsSpec().fc_bias is False
    assert build_heads(HeadsSpec(head_type="eagle", num_heads=1), target).fc.bias is None
    assert build_heads(HeadsSpec(head_type="eagle", num_heads=1, fc_bias=True), target).fc.bias is not None
    # A folder saved before the option existed: no fc_bias key, an fc.bias tensor.
    old = randomize(dh.EagleHead.for_target(target, fc_bias=True))
    old.config.extra.pop("fc_bias")
    old.save_pretrained(tmp_path / "old")
    assert "fc_bias" not in json.loads((tmp_path / "old" / "config.json").read_text())["extra"]
    loaded = dh.load_heads(tmp_path / "old", target=target)
    assert torch.equal(loaded.fc.bias, old.fc.bias)


# -- EAGLE-3 -> speculators (vLLM) and SGLang ---------------------------------------------------------
@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_eagle3_speculators_layout_conversions_and_function(tmp_path, fmt):
    target = target4()
    heads = eagle3_heads(target, feature_layers=[3, 0, 1], num_layers=2)  # listed out of layer order
    heads.save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / fmt, fmt, verifier="org/target-model")
    cfg, t = read_folder(out)
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 100
    assert cfg["norm_before_residual"] is False  # vLLM's default for this format is TRUE
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 3]  # residual stream after k layers, in layer order
    assert cfg["transformer_layer_config"]["num_aux_hidden_states"] == 3
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/target-model"
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == heads.config.num_heads
    assert "layers.0.hidden_norm.weight" in t and not any(k.startswith("midlayer") for k in t)

    # d2t holds offsets (target id = i + d2t[i]); draftheads keeps absolute ids.
    d2t = heads.draft_to_target
    assert t["d2t"].dtype == torch.int64 and torch.equal(torch.arange(100) + t["d2t"], d2t)
    assert not torch.equal(t["d2t"], d2t)
    # t2d: a bool mask over the target vocabulary.
    assert t["t2d"].dtype == torch.bool and t["t2d"].shape == (256,) and int(t["t2d"].sum()) == 100
    assert bool(t["t2d"][d2t].all())

    kw = dict(layer0="layers.0", later_norm="input_layernorm", norm_before_residual=cfg["norm_before_residual"])
    layer_cfg = {**cfg["transformer_layer_config"], "vocab_size": 256}
    # vLLM captures hidden state k for aux id k, in the config's order
    l1, l2, m1, m2 = eagle3_two_steps(heads, target, layer_cfg, t, cfg["eagle_aux_hidden_state_layer_ids"], **kw)
    torch.testing.assert_close(l1, m1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(l2, m2, rtol=1e-4, atol=1e-5)


def test_eagle3_sglang_layout_aux_ids_and_function(tmp_path):
    target = target4()
    heads = eagle3_heads(target, feature_layers=[3, 1, 2], num_layers=2, seed=3)
    heads.save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "sglang", "sglang"))
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 100
    # SGLang's explicit id j captures the output of layer j (it adds 1): draftheads' layer f -> j = f - 1.
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert cfg["norm_before_residual"] is False and cfg["target_hidden_size"] == 64
    assert "midlayer.hidden_norm.weight" in t and "midlayer.self_attn.q_proj.weight" in t
    assert "layers.1.hidden_norm.weight" in t and "layers.1.input_layernorm.weight" not in t
    assert torch.equal(torch.arange(100) + t["d2t"], heads.draft_to_target)

    kw = dict(layer0="midlayer", later_norm="hidden_norm", norm_before_residual=False)
    captured = [j + 1 for j in cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]  # SGLang: output of layer j
    l1, l2, m1, m2 = eagle3_two_steps(heads, target, cfg, t, captured, **kw)
    torch.testing.assert_close(l1, m1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(l2, m2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "fmt,layers,match",
    [
        ("vllm", [1, 2, 4], "feature layer 4 is the target's output after its final norm"),
        ("sglang", [1, 2, 4], "feature layer 4 is the target's output after its final norm"),
        ("vllm", [1, 1, 2], "repeat a layer"),
        ("sglang", [0, 1, 2], "feature layer 0 .* has no SGLang aux-layer id"),
        ("sglang", [2], "single target layer"),
    ],
)
def test_eagle3_aux_layers_an_engine_cannot_capture_are_refused(tmp_path, fmt, layers, match):
    eagle3_heads(target4(), feature_layers=layers).save_pretrained(tmp_path / "heads")
    with pytest.raises(ValueError, match=match):
        export_heads(tmp_path / "heads", tmp_path / "out", fmt, verifier="x")
    assert not (tmp_path / "out").exists()


def test_speculators_verifier_and_speculative_tokens(tmp_path, monkeypatch):
    from draftheads import smollm2

    target = target4()
    heads = eagle3_heads(target, feature_layers=[1, 2, 3])
    heads.config.target.name_or_path = "/models/recorded"
    heads.save_pretrained(tmp_path / "heads")

    def verifier(out, **kw):
        cfg = json.loads((export_heads(tmp_path / "heads", tmp_path / out, "speculators", **kw) / "config.json").read_text())
        return cfg["speculators_config"]["verifier"]["name_or_path"], cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"]

    assert verifier("a") == ("/models/recorded", heads.config.num_heads)
    assert verifier("b", verifier="org/other", num_speculative_tokens=2) == ("org/other", 2)
    monkeypatch.setattr(smollm2, "ensure_smollm2", lambda *a, **k: tmp_path / "smollm2-cache")
    assert verifier("c", verifier="smollm2")[0] == str(tmp_path / "smollm2-cache")  # the folder vLLM can open

    heads.config.target.name_or_path = ""
    heads.save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match="--verifier"):
        export_heads(tmp_path / "heads", tmp_path / "d", "speculators")


# -- refusals -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["vllm", "sglang", "speculators"])
def test_hydra_is_refused_naming_the_formats_that_exist(tmp_path, fmt):
    dh.HydraHeads.for_target(make_tiny_model("llama"), num_heads=2).save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match=r"hydra") as info:
        export_heads(tmp_path / "heads", tmp_path / "out", fmt, verifier="x")
    assert "medusa (vllm)" in str(info.value) or "Hydra has no engine format" in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind,fmt", [("medusa", "sglang"), ("medusa", "speculators"), ("eagle", "speculators")])
def test_head_types_a_format_does_not_hold_are_refused(tmp_path, kind, fmt):
    target = target4()
    cls = {"medusa": dh.MedusaHeads, "eagle": dh.EagleHead}[kind]
    cls.for_target(target).save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match=kind):
        export_heads(tmp_path / "heads", tmp_path / "out", fmt, verifier="x")


def test_existing_output_is_refused_unless_overwrite(tmp_path):
    dh.MedusaHeads.for_target(make_tiny_model("llama"), num_heads=2, lm_head="own").save_pretrained(tmp_path / "heads")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_heads(tmp_path / "heads", tmp_path / "out", "vllm")
    with pytest.raises(FileExistsError, match="keep.txt"):  # not an earlier export: --overwrite keeps it too
        export_heads(tmp_path / "heads", tmp_path / "out", "vllm", overwrite=True)
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    (tmp_path / "out" / "keep.txt").unlink()  # an empty folder loses nothing
    export_heads(tmp_path / "heads", tmp_path / "out", "vllm", overwrite=True)
    export_heads(tmp_path / "heads", tmp_path / "out", "vllm", overwrite=True)  # an earlier export is replaced
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "config.json", "draftheads_export.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []  # no temp folders left


def test_unknown_format_is_refused(tmp_path):
    dh.MedusaHeads.for_target(make_tiny_model("llama"), num_heads=2).save_pretrained(tmp_path / "heads")
    with pytest.raises(ExportError, match="unknown export format 'tensorrt'"):
        export_heads(tmp_path / "heads", tmp_path / "out", "tensorrt")


def test_cli_export(tmp_path, capsys):
    from draftheads.cli import main

    dh.MedusaHeads.for_target(make_tiny_model("llama"), num_heads=2, lm_head="own").save_pretrained(tmp_path / "heads")
    assert main(["export", str(tmp_path / "heads"), str(tmp_path / "out"), "--format", "vllm"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_heads"] == 2
    assert main(["export", str(tmp_path / "heads"), str(tmp_path / "out"), "--format", "vllm"]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "heads"), str(tmp_path / "out"), "--format", "vllm", "--overwrite"]) == 0
    assert load_file(str(tmp_path / "out" / "model.safetensors"))["blocks.0.layers.0.weight"].shape == (64, 64)


def test_speculative_tokens_an_export_cannot_serve_are_refused_and_the_rest_recorded(tmp_path, capsys):
    """0 used to write the heads' default; on a Medusa vLLM export the value was dropped silently:
    now it is recorded (metadata, the card's speculative_config) or refused, never ignored."""
    from draftheads.cli import main

    target = target4()
    eagle3_heads(target, feature_layers=[1, 2, 3]).save_pretrained(tmp_path / "eagle3")
    for bad in (0, -1):
        with pytest.raises(ExportError, match="num_speculative_tokens must be a whole number >= 1"):
            export_heads(tmp_path / "eagle3", tmp_path / "o", "vllm", verifier="org/target", num_speculative_tokens=bad)
    dh.MedusaHeads.for_target(make_tiny_model("llama"), num_heads=2).save_pretrained(tmp_path / "medusa")
    with pytest.raises(ExportError, match="num_speculative_tokens 3: these medusa heads draft at most 2"):
        export_heads(tmp_path / "medusa", tmp_path / "o", "vllm", num_speculative_tokens=3)
    assert not (tmp_path / "o").exists()
    assert main(["export", str(tmp_path / "medusa"), str(tmp_path / "o"), "--format", "vllm",
                 "--num-speculative-tokens", "0"]) == 2
    assert "num_speculative_tokens must be" in capsys.readouterr().err
    # recorded where the engine config has no slot for it: the metadata and the card say it
    out = export_heads(tmp_path / "medusa", tmp_path / "m1", "vllm", num_speculative_tokens=1)
    assert json.loads((out / "draftheads_export.json").read_text())["num_speculative_tokens"] == 1
    assert "\"num_speculative_tokens\": 1" in (out / "README.md").read_text()
    # written where the engine config has a slot
    out = export_heads(tmp_path / "eagle3", tmp_path / "ok", "vllm", verifier="org/target", num_speculative_tokens=1)
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 1


def test_a_verifier_folder_that_does_not_exist_is_refused(tmp_path, capsys):
    from draftheads.cli import main

    dh.MedusaHeads.for_target(make_tiny_model("llama"), num_heads=2).save_pretrained(tmp_path / "heads")
    missing = tmp_path / "does" / "not" / "exist"
    with pytest.raises(ExportError, match=f"--verifier: target {missing}: no such folder"):
        export_heads(tmp_path / "heads", tmp_path / "o", "vllm", verifier=str(missing))
    assert main(["export", str(tmp_path / "heads"), str(tmp_path / "o"), "--format", "vllm", "--verifier", str(missing)]) == 2
    assert "no such folder" in capsys.readouterr().err and not (tmp_path / "o").exists()
    # a Hub id is not fetched at export time: it is written as given
    assert export_heads(tmp_path / "heads", tmp_path / "ok", "vllm", verifier="org/target").is_dir()
