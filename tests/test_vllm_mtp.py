"""MTP heads exported by draftheads, served by a real vLLM (its CPU build, ``method: mtp``), accept what
draftheads accepts, draft position by draft position.

The targets are a tiny Qwen3.5 and a tiny Qwen3-Next (one Gated DeltaNet layer, one gated-attention
layer; Qwen3-Next's with experts, in its MTP layer too, which the export writes back per expert) shipping an MTP
layer under the names real checkpoints use, built so that every greedy choice, the target's and the
MTP layer's, wins by a wide margin (`mtp_utils.margined`): vLLM computes in bf16 with CPU
kernels of its own, and near ties of a random model made the two engines' texts differ (and
vLLM's own, with and without speculation, on one prompt of six). What vLLM's CPU build needs to
serve it, found out here:
- bf16: its CPU Gated DeltaNet kernel asserts BF16 ("CPU GDN attention requires BF16"), and
  ``chunk_gated_delta_rule_cpu`` takes a head dim of 128 only (32 fails: "Unexpected head dim
  size"), hence the linear-attention head dims of 128;
- no prefix caching: with it vLLM's hybrid cache runs in "align" mode, whose state copy before each
  step is a Triton kernel (``precopy_mamba_align_fused_kernel``), absent on CPU;
- an import-only torchvision (tests/engines/import_stubs): vLLM's qwen3_5.py imports its vision
  sibling, which imports torchvision, which the CPU venv does not have.
With those, plain decoding and MTP speculation both run.

Checked, as tests/test_vllm_engine.py does for the other head types: vLLM's output with MTP ==
its plain output; its accepted tokens per draft position and number of drafts == draftheads' own
chain decoding of the same heads (in bf16 too), counted as vLLM counts (tests/engines/vllm_counting.py);
and the comparison has teeth: the export with fc's halves swapped serves the same text but accepts
differently. vLLM is run in a subprocess with its own venv (skipped without one, failing
under CI).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import draftheads as dh
from engines.vllm_counting import decode_budget, vllm_counts
from test_vllm_engine import RUNNER, vllm_python

import mtp_utils as mu

REPO = Path(__file__).resolve().parents[1]
STUBS = REPO / "tests" / "engines" / "import_stubs"
K = 2
MAX_TOKENS = 32
NUM_PROMPTS = 6
RUN_TIMEOUT_S = 900
CHAIN = {"total_tokens": K + 1, "depth": K, "top_k": 1}
ENGINE = {"enable_prefix_caching": False}


def swapped_fc_halves(src: Path, dst: Path) -> None:
    """The export with fc's column halves in the wrong order ([hidden, embedding]: a classic bug)."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    w = tensors["mtp.fc.weight"]
    d = w.shape[0]
    tensors["mtp.fc.weight"] = torch.cat([w[:, d:], w[:, :d]], dim=1).contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module", params=["qwen3_5_text", "qwen3_next"])
def engine_run(request, tmp_path_factory):
    python = vllm_python()
    root = tmp_path_factory.mktemp(f"vllm-mtp-{request.param}")
    target_dir = mu.margined(root / "target", request.param)
    target = mu.load(target_dir, dtype=torch.bfloat16)
    heads = dh.load_heads("builtin-mtp", target=target)
    heads_dir = heads.save_pretrained(root / "heads")
    from draftheads.export import export_heads

    export = export_heads(heads_dir, root / "export", "vllm", verifier=str(target_dir), num_speculative_tokens=K)
    swapped_fc_halves(export, root / "export-swapped")
    prompts = torch.randint(3, 128, (NUM_PROMPTS, 8), generator=torch.Generator().manual_seed(7))
    spec = {
        "model": str(target_dir), "dtype": "bfloat16", "max_model_len": 256, "max_num_seqs": NUM_PROMPTS,
        "engines": [{"name": "plain", "speculative_config": None, "llm_kwargs": ENGINE}] + [
            {"name": name, "llm_kwargs": ENGINE,
             "speculative_config": {"method": "mtp", "model": str(folder), "num_speculative_tokens": K}}
            for name, folder in (("mtp", export), ("mtp_swapped", root / "export-swapped"))],
        "runs": [{"name": "greedy", "prompts": prompts.tolist(), "max_tokens": MAX_TOKENS}],
    }
    (root / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(STUBS)}
    proc = subprocess.run([str(python), str(RUNNER), "--spec", str(root / "spec.json"), "--out", str(root / "out.json")],
                          env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode != 0 or not (root / "out.json").is_file():
        pytest.fail(f"the vLLM runner failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    report = json.loads((root / "out.json").read_text())
    return {"report": report, "target": target, "heads": heads, "prompts": prompts}


def engine(run: dict, name: str) -> dict:
    result = run["report"]["engines"][name]
    assert "error" not in result, f"vLLM engine {name} failed:\n{result['error'][-3000:]}"
    return result["runs"]["greedy"]


def draftheads_counts(run: dict) -> tuple[int, list[int], list[list[int]]]:
    decoder = dh.SpeculativeDecoder(run["target"], run["heads"], tree=CHAIN, draft_budget=None, batch_plan=None)
    drafts, per_pos, outputs = 0, [0] * K, []
    for prompt in run["prompts"]:
        out = decoder.generate(prompt[None], max_new_tokens=decode_budget(MAX_TOKENS, K), eos_token_id=[])
        n, pos = vllm_counts(out.accept_lengths, MAX_TOKENS, K)
        drafts, per_pos = drafts + n, [a + b for a, b in zip(per_pos, pos)]
        outputs.append(out.sequences[0, prompt.shape[0]:][:MAX_TOKENS].tolist())
    return drafts, per_pos, outputs


def test_vllm_serves_the_exported_mtp_layer_with_draftheads_acceptance(engine_run):
    plain, mtp = engine(engine_run, "plain"), engine(engine_run, "mtp")
    assert mtp["outputs"] == plain["outputs"], "speculation changed vLLM's output"
    drafts, per_pos, outputs = draftheads_counts(engine_run)
    assert outputs == plain["outputs"], "draftheads (bf16) and vLLM (bf16) decode different text"
    counters = mtp["counters"][0]
    assert counters["num_drafts"] == drafts
    assert counters["accepted_per_pos"] == per_pos, (counters["accepted_per_pos"], per_pos)
    assert 0 < per_pos[-1] and per_pos[0] < drafts, "every draft accepted or none at some position: vacuous"


def test_an_export_with_fc_halves_swapped_accepts_differently(engine_run):
    """Equal output proves nothing about an export (verification makes any draft lossless)."""
    plain, swapped = engine(engine_run, "plain"), engine(engine_run, "mtp_swapped")
    assert swapped["outputs"] == plain["outputs"]
    assert swapped["counters"][0]["accepted_per_pos"] != engine(engine_run, "mtp")["counters"][0]["accepted_per_pos"]
