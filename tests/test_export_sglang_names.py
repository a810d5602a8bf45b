"""SGLang cannot be installed next to draftheads here (its CUDA kernels, its own torch pin), so
this checks exported folders against SGLang's weight loading as read BY HAND from the sglang
0.5.23 wheel (`pip download --no-deps sglang`):

- sglang/srt/models/llama_eagle3.py, `LlamaForCausalLMEagle3`: parameters `model.fc` (bias only with
  config.bias), `model.layers.{i}.self_attn.qkv_proj` (input 2H on layer 0, H after),
  `model.layers.{i}.self_attn.o_proj`, `model.layers.{i}.mlp.gate_up_proj/down_proj`,
  `model.layers.{i}.{input_layernorm,post_attention_layernorm,hidden_norm}`, `model.norm`,
  `lm_head` [draft_vocab, H], `model.embed_tokens` (set from the target). `load_weights`: renames
  "midlayer" -> "layers.0"; `d2t` -> hot_token_id = d2t + arange; skips `t2d`; q/k/v and gate/up go
  into the stacked params; a name is tried as is, then with "model."; anything else is SKIPPED
  without a word. Layer 0 reads `input_layernorm` (embedding) and `hidden_norm`; a later layer's
  pre-attention norm is its `hidden_norm` (its input_layernorm is never called).
- sglang/srt/models/llama_eagle.py, `LlamaForCausalLMEagle`: `model.fc` Linear(2H, H) WITH bias,
  layers as Llama's with no input_layernorm on layer 0; `load_weights` drops names with "lm_head"
  and prefixes the rest with "model." (then Llama's stacked-parameter loader).
The simulation below maps every exported tensor the way those loaders do and demands that each
lands on a parameter SGLang's forward uses, with the right shape, and that every such parameter is
written (an unwritten one keeps its random init)."""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from draftheads.export import export_heads
from engine_reference import read_folder
from test_export import eagle3_heads, randomize, target4

STACKED = {".q_proj": (".qkv_proj", "q"), ".k_proj": (".qkv_proj", "k"), ".v_proj": (".qkv_proj", "v"),
           ".gate_proj": (".gate_up_proj", 0), ".up_proj": (".gate_up_proj", 1)}


def used_params(cfg: dict, eagle3: bool) -> dict[str, dict]:
    """Parameters SGLang's draft forward reads: name -> {shard: shape} (unstacked shards)."""
    h, nh, kv, hd, inter = (cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size"))
    params: dict[str, dict] = {}
    if eagle3:
        n_aux = cfg["num_aux_hidden_states"]
        params["model.fc.weight"] = {None: (h, n_aux * h)}
        params["model.norm.weight"] = {None: (h,)}
        params["lm_head.weight"] = {None: (cfg["draft_vocab_size"], h)}
    else:
        params["model.fc.weight"] = {None: (h, 2 * h)}
        params["model.fc.bias"] = {None: (h,)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        attn_in = 2 * h if (eagle3 and i == 0) else h
        params[f"{p}.self_attn.qkv_proj.weight"] = {"q": (nh * hd, attn_in), "k": (kv * hd, attn_in), "v": (kv * hd, attn_in)}
        params[f"{p}.self_attn.o_proj.weight"] = {None: (h, nh * hd)}
        params[f"{p}.mlp.gate_up_proj.weight"] = {0: (inter, h), 1: (inter, h)}
        params[f"{p}.mlp.down_proj.weight"] = {None: (h, inter)}
        params[f"{p}.post_attention_layernorm.weight"] = {None: (h,)}
        if eagle3:
            params[f"{p}.hidden_norm.weight"] = {None: (h,)}
            if i == 0:
                params[f"{p}.input_layernorm.weight"] = {None: (h,)}
        elif i > 0:
            params[f"{p}.input_layernorm.weight"] = {None: (h,)}
    return params


def declared_only(cfg: dict) -> set[str]:
    """Declared by SGLang's modules but unused by the EAGLE-3 forward (a later layer's input_layernorm)."""
    return {f"model.layers.{i}.input_layernorm.weight" for i in range(1, cfg["num_hidden_layers"])}


def sglang_load(cfg: dict, tensors: dict, eagle3: bool) -> tuple[dict, list[str], dict]:
    """(param -> {shard: shape} written, names skipped silently, extra state like hot_token_id)."""
    params = used_params(cfg, eagle3)
    declared = set(params) | declared_only(cfg) | {"model.embed_tokens.weight"}
    written: dict[str, dict] = {}
    skipped, extra = [], {}
    for name, t in tensors.items():
        if eagle3:
            name = name.replace("midlayer", "layers.0")
            if "d2t" in name:
                extra["hot_token_id"] = t
                continue
            if "t2d" in name:
                continue
        elif "lm_head" in name:
            skipped.append(name)
            continue
        else:
            name = "model." + name
        shard = None
        for old, (new, sid) in STACKED.items():
            if old in name:
                name, shard = name.replace(old, new), sid
                break
        if eagle3:
            name = name if name in declared else f"model.{name}"
        if name not in declared:
            skipped.append(name)
            continue
        written.setdefault(name, {})[shard] = tuple(t.shape)
    return written, skipped, extra


def check(cfg, tensors, eagle3):
    written, skipped, extra = sglang_load(cfg, tensors, eagle3)
    assert skipped == [], f"SGLang would silently skip {skipped}"
    params = used_params(cfg, eagle3)
    unused = {k: v for k, v in written.items() if k not in params}
    assert not unused, f"written to parameters SGLang's forward never reads: {unused}"
    assert written == params  # every used parameter written, every shard with the right shape
    return extra


def test_sglang_eagle3_export_lands_on_every_parameter(tmp_path):
    heads = eagle3_heads(target4(), feature_layers=[1, 2, 3], num_layers=2)
    heads.save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "sglang", "sglang"))
    extra = check(cfg, t, eagle3=True)
    assert torch.equal(extra["hot_token_id"] + torch.arange(100), heads.draft_to_target)


def test_sglang_eagle_export_lands_on_every_parameter(tmp_path):
    randomize(dh.EagleHead.for_target(target4(), num_layers=2)).save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "sglang", "sglang"))
    check(cfg, t, eagle3=False)


def test_the_simulation_catches_a_vllm_eagle_folder_in_sglang(tmp_path):
    """vLLM's EAGLE-1 folder (no fc.bias) would leave SGLang's fc bias at its init: caught."""
    randomize(dh.EagleHead.for_target(target4())).save_pretrained(tmp_path / "heads")
    cfg, t = read_folder(export_heads(tmp_path / "heads", tmp_path / "vllm", "vllm"))
    with pytest.raises(AssertionError):
        check(cfg, t, eagle3=False)
