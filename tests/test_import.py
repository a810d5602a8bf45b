"""Imports of public draft checkpoints. The checkpoints here are written BY THE TESTS from the
documented layouts (key names, shapes, config keys of FasterDecoding Medusa, vLLM Medusa, SafeAILab
EAGLE, SpecForge/SGLang EAGLE-3, speculators), never by draftheads' exporter; imported heads must
compute what the engine forwards in engine_reference.py compute from those files. Round trips
(export -> import -> decode) must give the target's greedy tokens, the original heads' accept
lengths and the original heads' draft logits."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

import draftheads as dh
from conftest import make_tiny_model
from draftheads.export import export_heads, import_heads, read_heads
from engine_reference import eagle1_forward, medusa_logits
from inference_utils import greedy_reference
from test_export import draftheads_two_steps, eagle3_heads, eagle3_two_steps, hidden_states, randomize, target4

H, V = 64, 256
G = torch.Generator().manual_seed(0)


def rnd(*shape, std=0.1):
    return torch.randn(*shape, generator=G) * std


def norm_w():
    return 1.0 + rnd(H)


def write(folder, tensors, config=None, name="model.safetensors"):
    folder.mkdir(parents=True, exist_ok=True)
    if name.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / name))
    else:
        torch.save(tensors, folder / name)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def llama_layer(prefix, attn_in, input_norm):
    t = {
        f"{prefix}.self_attn.q_proj.weight": rnd(4 * 16, attn_in),
        f"{prefix}.self_attn.k_proj.weight": rnd(2 * 16, attn_in),
        f"{prefix}.self_attn.v_proj.weight": rnd(2 * 16, attn_in),
        f"{prefix}.self_attn.o_proj.weight": rnd(H, 4 * 16),
        f"{prefix}.mlp.gate_proj.weight": rnd(128, H),
        f"{prefix}.mlp.up_proj.weight": rnd(128, H),
        f"{prefix}.mlp.down_proj.weight": rnd(H, 128),
        f"{prefix}.post_attention_layernorm.weight": norm_w(),
    }
    if input_norm:
        t[f"{prefix}.input_layernorm.weight"] = norm_w()
    return t


LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": 128,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 1,
                "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": V, "hidden_act": "silu"}


@torch.no_grad()
def medusa_draft_logits(heads, hidden):
    return [heads.project(s, k) for k, s in enumerate(heads.head_states(hidden))]


# -- Medusa ---------------------------------------------------------------------------------------------
def test_fasterdecoding_medusa_v1_pt_with_a_config_that_miscounts_heads(tmp_path):
    target = make_tiny_model("llama")
    raw = {}
    for h in range(3):
        raw[f"{h}.0.linear.weight"], raw[f"{h}.0.linear.bias"], raw[f"{h}.1.weight"] = rnd(H, H), rnd(H), rnd(V, H)
    src = write(tmp_path / "medusa-v1", raw, {"medusa_num_heads": 5, "medusa_num_layers": 1,
                                              "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}, "medusa_lm_head.pt")
    with pytest.warns(UserWarning, match="config.json says 5 Medusa heads, the weights hold 3"):
        heads = read_heads(src, target)
    assert (heads.config.num_heads, heads.config.num_layers, heads.config.lm_head) == (3, 1, "own")
    hidden = hidden_states(target)[1][-1][0]
    for h, mine in enumerate(medusa_draft_logits(heads, hidden)):
        x = hidden + F.silu(hidden @ raw[f"{h}.0.linear.weight"].T + raw[f"{h}.0.linear.bias"])
        torch.testing.assert_close(mine, x @ raw[f"{h}.1.weight"].T, rtol=1e-5, atol=1e-5)


def test_medusa_v2_heads_inside_a_full_model_checkpoint(tmp_path):
    target = make_tiny_model("llama")
    raw = {"model.embed_tokens.weight": rnd(V, H), "lm_head.weight": rnd(V, H)}  # the fine-tuned base: ignored
    for h in range(2):
        for l in range(2):
            raw[f"medusa_head.{h}.{l}.linear.weight"], raw[f"medusa_head.{h}.{l}.linear.bias"] = rnd(H, H), rnd(H)
        raw[f"medusa_head.{h}.2.weight"] = rnd(V, H)
    src = write(tmp_path / "medusa-v2", raw, {"medusa_num_heads": 2, "medusa_num_layers": 2, "model_type": "llama"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the config agrees with the weights: no warning
        heads = read_heads(src, target)
    assert (heads.config.num_heads, heads.config.num_layers) == (2, 2)
    assert torch.equal(heads.blocks[1][1].linear.bias, raw["medusa_head.1.1.linear.bias"])


@pytest.mark.parametrize("fc_bias,original_lm_head", [(False, True), (True, False)])
def test_vllm_medusa(tmp_path, fc_bias, original_lm_head):
    target = make_tiny_model("llama")
    raw = {}
    for h in range(3):
        raw[f"blocks.{h}.layers.0.weight"] = rnd(H, H)
        if fc_bias:
            raw[f"blocks.{h}.layers.0.bias"] = rnd(H)
        if not original_lm_head:
            raw[f"lm_heads.{h}.weight"] = rnd(V, H)
    if original_lm_head:
        raw["lm_heads.0.weight"] = target.lm_head.weight.detach().clone()
    cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V, "num_heads": 3,
           "num_hidden_layers": 1, "medusa_fc_bias": fc_bias, "original_lm_head": original_lm_head}
    heads = read_heads(write(tmp_path / "vllm-medusa", raw, cfg), target)
    assert heads.config.lm_head == ("shared" if original_lm_head else "own")
    if not fc_bias:
        assert all(int((b[0].linear.bias != 0).sum()) == 0 for b in heads.blocks)
    hidden = hidden_states(target)[1][-1][0]
    for ref, mine in zip(medusa_logits(cfg, raw, hidden), medusa_draft_logits(heads, hidden)):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


# -- EAGLE-1/2 ------------------------------------------------------------------------------------------
def safeailab_eagle(target):
    raw = {"fc.weight": rnd(H, 2 * H), "fc.bias": rnd(H), "embed_tokens.weight": target.get_input_embeddings().weight.detach().clone()}
    raw.update(llama_layer("layers.0", H, input_norm=False))
    return raw


def test_safeailab_eagle_bin(tmp_path):
    target = target4()
    raw = safeailab_eagle(target)
    src = write(tmp_path / "eagle", raw, {**LLAMA_CONFIG, "bias": True}, "pytorch_model.bin")
    heads = read_heads(src, target)
    assert type(heads) is dh.EagleHead and heads.config.extra["fc_bias"] is True
    ids, hs = hidden_states(target)
    feats, emb, lm = hs[-1][0][:-2], target.get_input_embeddings(), target.get_output_embeddings()
    tok1, tok2 = ids[1:-1], ids[2:]
    pos = torch.arange(tok1.numel())
    with torch.no_grad():
        x1 = eagle1_forward(LLAMA_CONFIG, raw, emb(tok1), feats, pos, fc_bias=True)
        x2 = eagle1_forward(LLAMA_CONFIG, raw, emb(tok2), x1, pos, fc_bias=True)
    for ref, mine in zip((lm(x1), lm(x2)), draftheads_two_steps(heads, feats, tok1, tok2)):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-5)


def test_eagle_with_another_models_embedding_is_refused(tmp_path):
    target = target4()
    raw = safeailab_eagle(target)
    raw["embed_tokens.weight"] = rnd(V, H)
    with pytest.raises(ValueError, match="embed_tokens.weight differs from the target's embedding"):
        read_heads(write(tmp_path / "eagle", raw, LLAMA_CONFIG), target)


@pytest.mark.parametrize("layout", ["eagle", "eagle3", "speculators"])
def test_eagle_config_without_intermediate_size_is_a_named_error(tmp_path, layout):
    """It was a bare KeyError: 'intermediate_size'."""
    target = target4()
    layer_cfg = {k: v for k, v in LLAMA_CONFIG.items() if k != "intermediate_size"}
    if layout == "eagle":
        src = write(tmp_path / "e", safeailab_eagle(target), layer_cfg)
    elif layout == "eagle3":
        cfg = {**layer_cfg, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 100,
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
        src = write(tmp_path / "e", eagle3_checkpoint("midlayer"), cfg)
    else:
        cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "transformer_layer_config": layer_cfg,
               "draft_vocab_size": 100, "target_hidden_size": H, "norm_before_residual": False,
               "eagle_aux_hidden_state_layer_ids": [0, 1, 3]}
        src = write(tmp_path / "e", eagle3_checkpoint("layers.0", seed=1), cfg)
    with pytest.raises(ValueError, match="no intermediate_size .*mlp.gate_proj.weight"):
        read_heads(src, target)


# -- EAGLE-3 --------------------------------------------------------------------------------------------
def eagle3_checkpoint(prefix0, n_vocab=100, seed=0):
    perm = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n_vocab]  # NOT sorted by id
    raw = {"fc.weight": rnd(H, 3 * H), "norm.weight": norm_w(), "lm_head.weight": rnd(n_vocab, H),
           "d2t": perm - torch.arange(n_vocab)}  # offsets: target id = i + d2t[i]
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[perm] = True
    raw["t2d"] = t2d
    raw.update(llama_layer(prefix0, 2 * H, input_norm=True))
    raw[f"{prefix0}.hidden_norm.weight"] = norm_w()
    return raw


def check_eagle3(heads, target, raw, cfg, aux_layers, prefix0):
    kw = dict(layer0=prefix0, later_norm="input_layernorm", norm_before_residual=False)
    # aux_layers: what the engine captures, in layer order
    l1, l2, m1, m2 = eagle3_two_steps(heads, target, cfg, raw, aux_layers, **kw)
    torch.testing.assert_close(m1, l1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m2, l2, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model_prefix", ["", "model."])
def test_specforge_sglang_eagle3_midlayer(tmp_path, model_prefix):
    target = target4()
    raw = eagle3_checkpoint("midlayer")
    cfg = {**LLAMA_CONFIG, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 100, "target_hidden_size": H,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True}}
    src = write(tmp_path / "e3", {model_prefix + k if k not in ("d2t", "t2d") else k: v for k, v in raw.items()}, cfg)
    heads = read_heads(src, target)
    # SGLang's id j = the output of layer j = draftheads' feature layer j + 1.
    assert heads.feature_layers == [1, 2, 3] and heads.draft_to_target.numel() == 100
    assert bool((heads.draft_to_target[1:] > heads.draft_to_target[:-1]).all())  # re-sorted by target id
    check_eagle3(heads, target, raw, cfg, [1, 2, 3], "midlayer")


def test_speculators_eagle3(tmp_path):
    target = target4()
    raw = eagle3_checkpoint("layers.0", seed=1)
    layer_cfg = dict(LLAMA_CONFIG)
    cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "transformer_layer_config": layer_cfg,
           "draft_vocab_size": 100, "target_hidden_size": H, "norm_before_residual": False,
           "eagle_aux_hidden_state_layer_ids": [0, 1, 3],
           "speculators_config": {"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "default_proposal_method": "greedy", "verifier": {"name_or_path": "x", "architectures": []}}}
    heads = read_heads(write(tmp_path / "spec", raw, cfg), target)
    assert heads.feature_layers == [0, 1, 3]  # vLLM's id k = the input of layer k, draftheads' numbering
    check_eagle3(heads, target, raw, {**layer_cfg, "vocab_size": V}, [0, 1, 3], "layers.0")

    cfg.pop("norm_before_residual")  # vLLM reads this format with norm_before_residual TRUE by default
    with pytest.raises(ValueError, match="norm_before_residual set"):
        read_heads(write(tmp_path / "spec2", raw, cfg), target)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda raw, cfg: raw.pop("d2t"), "no d2t"),
        (lambda raw, cfg: raw["t2d"].__setitem__(slice(0, V), False), "t2d is not the mask"),
        (lambda raw, cfg: raw.__setitem__("d2t", raw["d2t"] + 10_000), "outside"),
        (lambda raw, cfg: cfg.__setitem__("fc_norm", True), "fc_norm set"),
        (lambda raw, cfg: cfg.__setitem__("rope_scaling", {"rope_type": "llama3", "factor": 8.0}), "RoPE scaling"),
        (lambda raw, cfg: raw.__setitem__("midlayer.self_attn.q_norm.weight", norm_w()), "no place in draftheads. EAGLE-3 head: midlayer.self_attn.q_norm"),
        (lambda raw, cfg: cfg.pop("eagle_config"), "repeat a layer"),  # defaults 2, L/2, L-3 on 4 layers: 2, 2, 1
    ],
)
def test_eagle3_checkpoints_draftheads_cannot_reproduce_are_refused(tmp_path, change, match):
    raw = eagle3_checkpoint("midlayer")
    cfg = {**LLAMA_CONFIG, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 100,
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
    change(raw, cfg)
    with pytest.raises(ValueError, match=match):
        read_heads(write(tmp_path / "e3", raw, cfg), target4())


# -- bad input ------------------------------------------------------------------------------------------
def test_unknown_layout_lists_what_was_looked_for(tmp_path):
    src = write(tmp_path / "x", {"encoder.weight": rnd(4, 4)})
    with pytest.raises(ValueError, match=r"layout not recognised[\s\S]*medusa:[\s\S]*vllm-medusa[\s\S]*eagle3[\s\S]*speculators"):
        read_heads(src, make_tiny_model("llama"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no weights in .* looked for model.safetensors"):
        read_heads(tmp_path / "empty", make_tiny_model("llama"))


def test_wrong_shapes_for_the_target_are_refused_naming_the_tensor(tmp_path):
    raw = {"0.0.linear.weight": rnd(32, 32), "0.0.linear.bias": rnd(32), "0.1.weight": rnd(V, 32)}
    with pytest.raises(ValueError, match=r"does not fit the target \(hidden 64, vocab 256\).*blocks.0.0.linear.weight: \(32, 32\)"):
        read_heads(write(tmp_path / "m", raw, {}), make_tiny_model("llama"))


def test_pickles_are_read_only_as_plain_tensors(tmp_path):
    import datetime

    torch.save({"0.0.linear.weight": rnd(H, H), "when": datetime.datetime.now()}, tmp_path / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match=r"weights_only=True"):
        read_heads(tmp_path / "medusa_lm_head.pt", make_tiny_model("llama"))


def test_import_refuses_an_existing_output(tmp_path):
    raw = {"0.0.linear.weight": rnd(H, H), "0.0.linear.bias": rnd(H), "0.1.weight": rnd(V, H)}
    src = write(tmp_path / "m", raw, {})
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match="overwrite"):
        import_heads(src, tmp_path / "out", make_tiny_model("llama"))
    out = import_heads(src, tmp_path / "out", make_tiny_model("llama"), overwrite=True)
    assert dh.load_heads(out, target=make_tiny_model("llama")).config.num_heads == 1


# -- round trips: export -> import -> decode ----------------------------------------------------------
def decode(target, heads, prompt, n=24):
    out = dh.SpeculativeDecoder(target, heads).generate(prompt, max_new_tokens=n, temperature=0.0)
    return out.sequences, out.accept_lengths


ROUND_TRIPS = [
    ("medusa-own", "vllm"),
    ("medusa-shared", "vllm"),
    ("eagle", "vllm"),
    ("eagle-bias", "sglang"),
    ("eagle3", "vllm"),
    ("eagle3", "sglang"),
]


@pytest.mark.parametrize("kind,fmt", ROUND_TRIPS)
def test_round_trip_gives_the_same_draft_logits_and_decoding(tmp_path, tiny_target_dir, kind, fmt):
    from transformers import AutoModelForCausalLM

    if kind.startswith("medusa"):
        target = AutoModelForCausalLM.from_pretrained(tiny_target_dir).eval()  # the shared head is read from here
        heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1, lm_head=kind.split("-")[1])
        randomize(heads, std=0.02)
    elif kind.startswith("eagle") and kind != "eagle3":
        target = target4()
        heads = randomize(dh.EagleHead.for_target(target, num_layers=1, fc_bias=kind == "eagle-bias"), std=0.05)
    else:
        target = target4()
        heads = eagle3_heads(target, feature_layers=[3, 1, 2], num_layers=1)
    heads.save_pretrained(tmp_path / "heads")
    exported = export_heads(tmp_path / "heads", tmp_path / "engine", fmt, verifier=str(tiny_target_dir))
    back = dh.load_heads(import_heads(exported, tmp_path / "back", target), target=target)
    assert type(back) is type(heads)

    ids, hs = hidden_states(target)
    if kind.startswith("medusa"):
        assert back.config.lm_head == heads.config.lm_head
        for a, b in zip(medusa_draft_logits(heads, hs[-1][0]), medusa_draft_logits(back, hs[-1][0])):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
    else:
        from inference_utils import select_features as sel
        mine = draftheads_two_steps(heads, sel(hs, heads.feature_layers)[0][:-2], ids[1:-1], ids[2:])
        theirs = draftheads_two_steps(back, sel(hs, back.feature_layers)[0][:-2], ids[1:-1], ids[2:])
        # EAGLE-3's fc columns come back in layer order: the same sum in another order (float rounding only).
        tol = dict(rtol=1e-4, atol=1e-5) if kind == "eagle3" else dict(rtol=0, atol=0)
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(b, a, **tol)

    prompt = ids[None, :8]
    seq_a, acc_a = decode(target, heads, prompt)
    seq_b, acc_b = decode(target, back, prompt)
    assert torch.equal(seq_b, greedy_reference(target, prompt, 24))
    assert torch.equal(seq_a, seq_b) and acc_a == acc_b


# -- continuing training from imported heads ------------------------------------------------------------
def test_init_from_loads_imported_heads_and_refuses_other_sizes(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.config import config_from_dict
    from draftheads.train.loop import run

    raw = {}
    for h in range(3):
        raw[f"{h}.0.linear.weight"], raw[f"{h}.0.linear.bias"], raw[f"{h}.1.weight"] = rnd(H, H), rnd(H), rnd(V, H)
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    imported = import_heads(write(tmp_path / "medusa", raw, {}), tmp_path / "imported", target)

    def cfg(out, **heads):
        return config_from_dict({
            "target": {"name_or_path": str(tiny_target_dir), "dtype": "float32"},
            "heads": {"num_heads": 3, "num_layers": 1, "lm_head": "own", "init_from": str(imported), **heads},
            "data": {"path": str(tiny_text_jsonl), "format": "text", "max_length": 32, "eval_fraction": 0.1,
                     "cache_dir": str(tmp_path / "hf-cache")},
            "train": {"output_dir": str(tmp_path / out), "max_steps": 2, "batch_size": 2, "lr": 1e-12,
                      "warmup_steps": 0, "eval_every": 0, "eval_batches": 1, "save_every": 0, "choose_tree": False},
        })

    result = run(cfg("run"))
    trained = dh.load_heads(result.heads_dir)
    for h in range(3):  # lr ~0: the trained heads are the imported ones (fresh heads would be zero blocks)
        torch.testing.assert_close(trained.blocks[h][0].linear.weight, raw[f"{h}.0.linear.weight"], rtol=0, atol=1e-8)
        torch.testing.assert_close(trained.lm_heads[h].weight, raw[f"{h}.1.weight"], rtol=0, atol=1e-8)
    with pytest.raises(ValueError, match=r"init_from: .* does not match[\s\S]*num_layers: config has 2, .* has 1"):
        run(cfg("bad", num_layers=2))


def test_cli_import(tmp_path, tiny_target_dir, capsys):
    from draftheads.cli import main

    raw = {"0.0.linear.weight": rnd(H, H), "0.0.linear.bias": rnd(H), "0.1.weight": rnd(V, H)}
    src = write(tmp_path / "m", raw, {"medusa_num_heads": 1})
    args = ["import", str(src), str(tmp_path / "out"), "--target", str(tiny_target_dir), "--dtype", "float32"]
    assert main(args) == 0
    from transformers import AutoModelForCausalLM

    heads = dh.load_heads(tmp_path / "out", target=AutoModelForCausalLM.from_pretrained(tiny_target_dir))
    assert torch.equal(heads.blocks[0][0].linear.weight, raw["0.0.linear.weight"])
    assert main(args) == 2 and "exists" in capsys.readouterr().err
    assert main(args + ["--overwrite", "--format", "eagle"]) == 2  # forced wrong layout: a clear error, not a crash


def test_init_from_keeps_an_imported_eagle_layer_and_names_a_config_difference(tmp_path):
    """An imported EAGLE layer may have another geometry than the target's (here: a wider MLP): training
    continues with it; an fc bias the config does not ask for is named, with the key to set."""
    from draftheads.config import HeadsSpec
    from draftheads.train.loop import build_heads, init_heads_from

    target = target4()
    raw = safeailab_eagle(target)
    for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
        raw[f"layers.0.{name}"] = rnd(192, H)
    raw["layers.0.mlp.down_proj.weight"] = rnd(H, 192)
    src = write(tmp_path / "eagle", raw, {**LLAMA_CONFIG, "intermediate_size": 192})
    imported = import_heads(src, tmp_path / "imported", target)
    with pytest.raises(ValueError, match=r"heads.fc_bias: config has False, .* has True"):
        init_heads_from(build_heads(HeadsSpec(head_type="eagle", num_heads=2), target), str(imported), target)
    heads = init_heads_from(build_heads(HeadsSpec(head_type="eagle", num_heads=2, fc_bias=True, noise=0.2), target),
                            str(imported), target)
    assert heads.config.num_heads == 2 and heads.config.extra["noise"] == 0.2  # training settings: the config's
    assert heads.layers[0].gate_proj.weight.shape == (192, H)
    assert torch.equal(heads.fc.bias, raw["fc.bias"])
