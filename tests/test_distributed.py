"""Two-process training on CPU through `accelerate launch`: DDP and DeepSpeed ZeRO-2/ZeRO-3 (gloo).

Each rank saves its heads' weights after training; both ranks must hold identical weights, equal
to the rank-0 export. The first DeepSpeed run on a machine JIT-builds its `deepspeed_shm_comm` op
(about 30 s, cached in ~/.cache/torch_extensions afterwards).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent(
    """
    import json, os, sys
    from safetensors.torch import save_file
    from draftheads.config import config_from_dict
    from draftheads.train.loop import run

    cfg = config_from_dict(json.loads(sys.argv[1]))
    result = run(cfg)
    rank = int(os.environ.get("RANK", "0"))
    state = {k: v.detach().cpu().contiguous() for k, v in result.heads.state_dict().items()}
    save_file(state, os.path.join(cfg.train.output_dir, f"rank{rank}.safetensors"))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path, target_dir: Path, data: Path, heads: dict | None = None, **train) -> dict:
    # 10 eval rows: not a multiple of batch 4 x 2 processes, so the eval shards are uneven
    return {
        "target": {"name_or_path": str(target_dir), "dtype": "float32"},
        "heads": heads or {"num_heads": 3, "num_layers": 1, "lm_head": "own"},
        "data": {"path": str(data), "format": "text", "max_length": 48, "eval_fraction": 0.125,
                 "cache_dir": str(tmp_path / "hf-cache")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 6, "batch_size": 4, "grad_accum": 2, "lr": 1e-2,
                  "warmup_steps": 1, "eval_every": 3, "eval_batches": 0, "save_every": 3, "log_every": 3,
                  "choose_tree": False, **train},  # the tree choice under DDP: test_ddp_two_processes_on_cpu
    }


def _launch(tmp_path: Path, accelerate_config: str, target_dir: Path, data: Path, timeout: int = 240,
            heads: dict | None = None, **train) -> Path:
    cfg = _config(tmp_path, target_dir, data, heads, **train)
    out = Path(cfg["train"]["output_dir"])
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "configs" / "accelerate" / accelerate_config),
        "--main_process_port", str(_free_port()),
        str(driver), json.dumps(cfg),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out


def _check_ranks_agree(out: Path, distributed_type: str) -> None:
    rank0 = load_file(str(out / "rank0.safetensors"))
    rank1 = load_file(str(out / "rank1.safetensors"))
    exported = load_file(str(out / "heads" / "model.safetensors"))
    assert rank0.keys() == rank1.keys() == exported.keys()
    for k in rank0:
        assert (rank0[k] == rank1[k]).all(), f"{k} differs between ranks"
        assert (rank0[k] == exported[k].to(rank0[k].dtype)).all(), f"{k} differs from the export"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_processes"] == 2 and metrics["step"] == 6
    assert metrics["distributed_type"] == distributed_type
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-3", "step-6"]
    assert "eval/acceptance_length" in metrics["final_eval"]
    assert metrics["final_eval"]["eval/tokens"] == _eval_targets(out), "every eval row counted exactly once"


def _eval_targets(out: Path) -> int:
    """Head 0's targets over the whole eval split, counted here from the data alone."""
    from transformers import AutoTokenizer

    from draftheads.config import config_from_dict
    from draftheads.data import build_datasets
    from draftheads.methods.medusa.loss import medusa_target_counts

    cfg = config_from_dict(json.loads((out / "config.json").read_text()))
    _, eval_ds, _ = build_datasets(cfg.data, AutoTokenizer.from_pretrained(cfg.target.name_or_path))
    assert len(eval_ds) == 10
    total = 0
    for row in eval_ds:
        ids = torch.tensor([row["input_ids"]])
        total += int(medusa_target_counts(ids, 3, torch.tensor([row["loss_mask"]]))[0])
    return total


@pytest.mark.slow
def test_ddp_two_processes_on_cpu(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """2 processes x 1 micro-batch must make the same updates as 1 process x grad_accum 2 (the
    same rows per step): the loss is normalised by the step's global token count."""
    out = _launch(tmp_path, "cpu_ddp.yaml", tiny_target_dir, tiny_text_jsonl, grad_accum=1, choose_tree=True)
    _check_ranks_agree(out, "MULTI_CPU")
    assert (out / "heads" / "tree.json").is_file(), "the main process chooses the tree while the other waits"

    from draftheads.config import config_from_dict
    from draftheads.train.loop import run

    single = config_from_dict(_config(tmp_path / "single", tiny_target_dir, tiny_text_jsonl, grad_accum=2))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        heads_dir = run(single).heads_dir
    finally:
        torch.set_num_threads(before)
    one, two = load_file(str(heads_dir / "model.safetensors")), load_file(str(out / "heads" / "model.safetensors"))
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=2e-6, msg=k)


@pytest.mark.slow
def test_deepspeed_zero2_two_processes_on_cpu(tmp_path, tiny_target_dir, tiny_text_jsonl):
    pytest.importorskip("deepspeed")
    out = _launch(tmp_path, "cpu_zero2.yaml", tiny_target_dir, tiny_text_jsonl)
    _check_ranks_agree(out, "DEEPSPEED")


@pytest.mark.slow
def test_deepspeed_zero3_two_processes_on_cpu(tmp_path, tiny_target_dir, tiny_text_jsonl):
    pytest.importorskip("deepspeed")
    out = _launch(tmp_path, "cpu_zero3.yaml", tiny_target_dir, tiny_text_jsonl)
    _check_ranks_agree(out, "DEEPSPEED")


@pytest.mark.slow
def test_zero3_starts_eagle3s_lm_head_from_the_sharded_targets_rows(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """Under ZeRO-3 the target is loaded sharded: `heads.lm_head_init: target` must gather its LM
    head and final norm before copying them (one step at lr 0: the export is the start)."""
    pytest.importorskip("deepspeed")
    import shutil

    from draftheads.target import load_target

    target_dir = tmp_path / "target"  # a copy whose final norm is not all ones, so a copy shows
    shutil.copytree(tiny_target_dir, target_dir)
    target, _ = load_target(target_dir)
    with torch.no_grad():
        target.model.norm.weight.copy_(torch.linspace(0.5, 1.5, target.model.norm.weight.numel()))
    target.save_pretrained(target_dir)
    heads = {"head_type": "eagle3", "num_heads": 2, "num_layers": 1, "draft_vocab_size": 64, "lm_head_init": "target"}
    out = _launch(tmp_path, "cpu_zero3.yaml", target_dir, tiny_text_jsonl, heads=heads, max_steps=1,
                  warmup_steps=1, lr_schedule="constant", eval_every=0, save_every=0)  # fmt: skip
    exported = load_file(str(out / "heads" / "model.safetensors"))
    rows = target.get_output_embeddings().weight.detach()[exported["draft_to_target"]]
    assert torch.equal(exported["lm_head.weight"], rows)
    assert torch.equal(exported["norm.weight"], target.model.norm.weight.detach())
