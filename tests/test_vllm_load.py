"""DSpark and DFlash2 exports, read by vLLM's own config code and loaded into vLLM's own model classes,
compute what draftheads computes.

vLLM 0.32 serves neither on this CPU build: both need its Model Runner V2 ("Model Runner V1 does
not support: dspark speculative decoding" / "DFlash candidate-head drafts"), which needs Triton on
a GPU. So acceptance per position cannot be compared in a running engine as for the other heads
(tests/test_vllm_engine.py). What is checked instead, in the vLLM venv
(tests/engines/vllm_load_check.py), and compared here with draftheads' own modules:

- the refusal itself, by its words (the export's `check_engine` names it before writing);
- what vLLM resolves from the folder: the method, the draft length, the mask token, the target
  layers it captures (= draftheads' feature layers), every layer non-causal, ``sample_from_anchor``,
  the Markov rank and confidence head, the selector's candidates, the convolution's block, the
  target's LM head shared;
- vLLM's model, with the loaded weights, on the same inputs: the whole block forward (embedding,
  layers with q/k norms, RoPE, projections and DFlash2's convolutions, final norm; only the
  attention kernel replaced by plain attention within the block), ``fc`` and ``hidden_norm`` on
  features, DSpark's Markov bias, its greedy left-to-right chain and confidences as vLLM's speculator
  computes them, DFlash2's candidates and its selector's greedy walk;
- the comparison can fail: an export with the Markov factors swapped, or with DFlash2's
  convolution sides swapped (same shapes, loaded without a word) computes otherwise.

Skips without the vLLM venv (fails under CI), like tests/test_vllm_engine.py.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import draftheads as dh
from draftheads.export import export_heads
from draftheads.inference.proposers.chained import SlotScores

from test_vllm_engine import REPO, VOCAB, tiny_llama_target, vllm_python

CHECK = REPO / "tests" / "engines" / "vllm_load_check.py"
MASK = VOCAB - 1
ROWS = 3


def perturbed_dflash2(heads):
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in heads.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.base_kernel.add_(torch.randn(conv.base_kernel.shape, generator=gen) * 0.3)
                conv.kernel_projection.weight.normal_(0.0, 0.05, generator=gen)
        sel = heads.candidate_selector
        for p in (sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight):
            p.normal_(0.0, 1.0, generator=gen)
    return heads


def build(root: Path):
    target = tiny_llama_target(root / "target")
    torch.manual_seed(0)
    dspark = dh.DSparkHeads.for_target(target, num_layers=2, block_size=3, mask_token_id=MASK, feature_layers=[1, 2, 3],
                                       markov_rank=16)
    with torch.no_grad():
        dspark.markov_head.markov_w2.weight.normal_(0.0, 0.5)
        dspark.confidence_head.proj.weight.normal_(0.0, 0.1)
        dspark.confidence_head.proj.bias.fill_(0.3)
    dflash2 = perturbed_dflash2(dh.DFlash2Heads.for_target(target, num_layers=2, block_size=4, mask_token_id=MASK,
                                                           feature_layers=[1, 2, 3], selector_rank=16, selector_top_k=8,
                                                           conv_group_size=16))
    drafts, heads = [], {}
    for name, h, method in (("dspark", dspark, "dspark"), ("dflash2", dflash2, "dflash")):
        h.save_pretrained(root / f"heads-{name}")
        out = export_heads(root / f"heads-{name}", root / f"vllm-{name}", "vllm", verifier=str(root / "target"),
                           engine_check=False)
        k = h.config.num_heads
        drafts.append({"name": name, "kind": name, "speculative_config": {"method": method, "model": str(out),
                                                                           "num_speculative_tokens": k}})
        heads[name] = h
    broken = {"dspark_markov_swapped": ("dspark", "markov_head.markov_w1.weight", "markov_head.markov_w2.weight"),
              "dflash2_conv_sides_swapped": ("dflash2", None, None)}
    for how, (name, a, b) in broken.items():
        src = root / f"vllm-{name}"
        dst = root / f"broken-{how}"
        import shutil

        shutil.copytree(src, dst)
        tensors = load_file(str(dst / "model.safetensors"))
        if a is not None:
            tensors[a], tensors[b] = tensors[b], tensors[a]
        else:
            for key in [k for k in tensors if k.endswith("attention_conv.base_kernel")]:
                tensors[key] = tensors[key].flip(0).contiguous()
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
        spec = next(d for d in drafts if d["name"] == name)
        drafts.append({"name": how, "kind": name, "speculative_config": {**spec["speculative_config"], "model": str(dst)}})
    return target, heads, drafts


def inputs_for(target, heads) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(9)
    d = target.config.hidden_size
    roots = torch.randint(3, VOCAB - 1, (ROWS,), generator=gen)
    blocks = {}
    for name, h in heads.items():
        block = h.block_size
        ids = h.block_inputs(roots).reshape(-1)
        positions = (torch.tensor([5, 11, 20])[:, None] + torch.arange(block)).reshape(-1)
        blocks[name] = (ids, positions)
    # one block layout per family: DSpark blocks of 3, DFlash2 blocks of 4 (drafted separately)
    return {
        "roots": roots, "features": torch.randn(7, 3 * d, generator=gen), "features_h": torch.randn(7, d, generator=gen),
        "slot_states": torch.randn(ROWS, 3, d, generator=gen), "anchors": roots.clone(),
        "previous": torch.randint(0, VOCAB, (7,), generator=gen), **{f"{n}_ids": v[0] for n, v in blocks.items()},
        **{f"{n}_positions": v[1] for n, v in blocks.items()},
    }


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    python = vllm_python()
    root = tmp_path_factory.mktemp("vllm-load")
    target, heads, drafts = build(root)
    inputs = inputs_for(target, heads)
    results, tensors = {}, {}
    for family in ("dspark", "dflash2"):  # one input file per family: their blocks differ in width
        family_inputs = {**inputs, "block_ids": inputs[f"{family}_ids"].clone(), "block_positions": inputs[f"{family}_positions"].clone()}
        save_file(family_inputs, str(root / f"inputs-{family}.safetensors"))
        spec = {"target": str(root / "target"), "inputs": str(root / f"inputs-{family}.safetensors"),
                "drafts": [d for d in drafts if d["kind"] == family], "port": 29533 + (family == "dflash2")}
        (root / f"spec-{family}.json").write_text(json.dumps(spec))
        out = root / f"result-{family}.json"
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        proc = subprocess.run([str(python), str(CHECK), "--spec", str(root / f"spec-{family}.json"), "--out", str(out)],
                              env=env, capture_output=True, text=True, timeout=900, cwd=str(root))
        if proc.returncode != 0 or not out.exists():
            pytest.fail(f"the vLLM load check failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        results.update(json.loads(out.read_text()))
        tensors.update(load_file(str(out) + ".safetensors"))
    return target, heads, inputs, results, tensors


def result(loaded, name: str) -> dict:
    got = loaded[3][name]
    assert "error" not in got, f"vLLM failed on {name}:\n{got['error']}"
    return got


def ours(loaded, name: str) -> dict[str, torch.Tensor]:
    """draftheads' own computation of every piece the vLLM side ran."""
    target, heads, inputs, _, _ = loaded
    h = heads[name]
    ids, positions = inputs[f"{name}_ids"][None], inputs[f"{name}_positions"][None]
    block, n = h.block_size, ids.shape[1]
    ex = h.config.extra
    empty = [(torch.zeros(1, ex["num_key_value_heads"], 0, ex["head_dim"]),) * 2 for _ in h.layers]
    own = torch.arange(n) // block
    mask = (own[:, None] == own[None, :])[None]  # each block attends to itself only, bidirectionally
    drafter = h.proposer()
    states = inputs["slot_states"]
    out = {}
    with torch.inference_mode():
        out["block_states"] = h.block_states(ids, positions, empty, mask)[0]
        out["fc"] = h.fc(inputs["features"])
        out["hidden_norm"] = h.hidden_norm(inputs["features_h"])
        if name == "dspark":
            slots = SlotScores({"states": states, "base": drafter.logits(states)})
        else:
            unary, candidates = drafter.logits(states).topk(h.selector_top_k, dim=-1)
            slots = SlotScores({"states": states, "unary": unary, "candidates": candidates})
            out["candidates"], out["unary"] = candidates, unary
        previous, chain, confidence = inputs["anchors"], [], []
        everyone = torch.arange(ROWS)
        for d in range(1, h.config.num_heads + 1):
            token = drafter.step_scores(slots, everyone, d, previous).argmax(-1)
            if name == "dspark":
                confidence.append(torch.sigmoid(h.confidence_logits(states[:, d - 1], previous)))
            chain.append(token)
            previous = token
        out["chain"] = torch.stack(chain, 1)
        if name == "dspark":
            out["confidence"] = torch.stack(confidence, 1)
            out["markov_bias"] = h.markov_bias(inputs["previous"])
    return out


@pytest.mark.parametrize("name,refusal", [("dspark", "Model Runner V1 does not support: dspark speculative decoding"),
                                          ("dflash2", "Model Runner V1 does not support: DFlash candidate-head drafts")])
def test_the_cpu_build_refuses_to_serve_them_by_name(loaded, name, refusal):
    assert refusal in (result(loaded, name)["refusal"] or ""), result(loaded, name)["refusal"]


def test_vllm_resolves_the_dspark_folder_as_draftheads_drafts(loaded):
    got, h = result(loaded, "dspark"), loaded[1]["dspark"]
    assert got["method"] == "dspark" and got["architecture"] == "Qwen3DSparkForCausalLM"
    assert got["num_speculative_tokens"] == h.config.num_heads == h.block_size and got["sample_from_anchor"] is True
    assert got["mask_token_id"] == MASK and got["aux_layers"] == h.feature_layers
    assert got["causal"] == [False] * len(h.layers) and got["lm_head_is_targets"]
    assert got["markov_rank"] == h.markov_rank and got["confidence_head"] is True


def test_vllm_resolves_the_dflash2_folder_as_draftheads_drafts(loaded):
    got, h = result(loaded, "dflash2"), loaded[1]["dflash2"]
    assert got["method"] == "dflash" and got["architecture"] == "DFlash2Qwen3ForCausalLM"
    assert got["num_speculative_tokens"] == h.block_size - 1 and got["conv_block"] == h.block_size
    assert got["mask_token_id"] == MASK and got["aux_layers"] == h.feature_layers
    assert got["causal"] == [False] * len(h.layers) and got["selector_top_k"] == h.selector_top_k


@pytest.mark.parametrize("name", ["dspark", "dflash2"])
def test_vllms_model_computes_what_draftheads_computes(loaded, name):
    result(loaded, name)
    expected = ours(loaded, name)
    tensors = loaded[4]
    for piece, value in expected.items():
        got = tensors[f"{name}.{piece}"]
        if value.dtype.is_floating_point:
            assert torch.allclose(got.float(), value.float(), atol=1e-4, rtol=1e-4), \
                f"{name}.{piece}: max difference {float((got.float() - value.float()).abs().max()):.3g}"
        else:
            assert torch.equal(got.long(), value.long()), f"{name}.{piece}: vLLM {got.tolist()} vs draftheads {value.tolist()}"


@pytest.mark.parametrize("how,family,piece", [("dspark_markov_swapped", "dspark", "markov_bias"),
                                              ("dflash2_conv_sides_swapped", "dflash2", "block_states")])
def test_an_export_bug_vllm_loads_silently_is_seen(loaded, how, family, piece):
    """The comparison can fail: same shapes, loaded without a word, other numbers."""
    result(loaded, how)
    got = loaded[4][f"{how}.{piece}"]
    assert not torch.allclose(got.float(), ours(loaded, family)[piece].float(), atol=1e-4)


def test_the_export_asks_the_installed_vllm_and_refuses_by_name(tmp_path, monkeypatch):
    """The real probe of the installed vLLM (its CPU build: no Triton backend, so no Model Runner V2)."""
    import draftheads.methods.runner_check as runner_check
    from draftheads.export.common import ExportError

    monkeypatch.setenv("DRAFTHEADS_VLLM_PYTHON", str(vllm_python()))
    runner_check.installed_vllm.cache_clear()
    try:
        engine = runner_check.installed_vllm()
        assert engine is not None and engine.version.startswith("0.32") and not engine.has_v2_runner
        assert {"Qwen3DSparkModel", "DFlash2DraftModel"} <= engine.architectures
        target = tiny_llama_target(tmp_path / "target")
        heads = dh.DSparkHeads.for_target(target, num_layers=1, block_size=3, mask_token_id=MASK, feature_layers=[1, 2, 3])
        heads.save_pretrained(tmp_path / "heads")
        with pytest.raises(ExportError, match=r"DSpark drafts run only on vLLM's Model Runner V2.*installed vLLM 0\.32"):
            export_heads(tmp_path / "heads", tmp_path / "out", "vllm", verifier=str(tmp_path / "target"))
        assert not (tmp_path / "out").exists()
    finally:
        runner_check.installed_vllm.cache_clear()
