"""FSDP through `accelerate launch` on CPU (gloo), two processes: the heads sharded, the frozen
target replicated, the updates those of one process, checkpoints resumed exactly, and settings
draftheads cannot train with refused by name."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_distributed import DRIVER, REPO, _check_ranks_agree, _config, _free_port

from draftheads.train.distributed import FSDPSetupError, check_fsdp_plugin

#: The distributed tests' driver, able to stop both processes right after the checkpoint of one
#: step (as a killed run would, without their teardown), for the resume test.
STOPPING_DRIVER = """
import os
stop = int(os.environ.get("DRAFTHEADS_TEST_STOP_AFTER", "0"))
if stop:
    from draftheads.train import trainer

    real_save = trainer.save_checkpoint

    def save_then_stop(accelerator, output_dir, step, state):
        path = real_save(accelerator, output_dir, step, state)
        if step == stop:
            accelerator.wait_for_everyone()
            os._exit(0)
        return path

    trainer.save_checkpoint = save_then_stop
""" + DRIVER


def _launch_fsdp(tmp_path: Path, target_dir: Path, data: Path, name: str, stop_after: int = 0, **train) -> tuple[Path, str]:
    cfg = _config(tmp_path, target_dir, data, **train)
    cfg["train"]["output_dir"] = str(tmp_path / name)
    driver = tmp_path / "fsdp_driver.py"
    driver.write_text(STOPPING_DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "DRAFTHEADS_TEST_STOP_AFTER": str(stop_after),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "configs" / "accelerate" / "cpu_fsdp.yaml"),
        "--main_process_port", str(_free_port()),
        str(driver), json.dumps(cfg),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return Path(cfg["train"]["output_dir"]), proc.stdout


@pytest.mark.slow
def test_fsdp_two_processes_on_cpu_shard_the_heads_and_resume_exactly(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """2 FSDP processes x 1 micro-batch make the updates of 1 process x grad_accum 2; a run
    stopped right after its step-3 checkpoint and resumed ends with exactly the heads, metrics
    history and best/ of the straight run."""
    straight, printed = _launch_fsdp(tmp_path, tiny_target_dir, tiny_text_jsonl, "straight", grad_accum=1)
    _check_ranks_agree(straight, "FSDP")
    # the wrapped model itself says what is sharded: half the heads here, the whole target replicated
    line = next(line for line in printed.splitlines() if line.startswith("FSDP: "))
    heads, local = (int(w) for w in (line.split("heads' ")[1].split()[0], line.split("(")[1].split()[0]))
    assert local == (heads + 1) // 2 and "target's" in line and "replicated on every process" in line, line

    from draftheads.config import config_from_dict
    from draftheads.train.loop import run

    single = config_from_dict(_config(tmp_path / "single", tiny_target_dir, tiny_text_jsonl, grad_accum=2))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        heads_dir = run(single).heads_dir
    finally:
        torch.set_num_threads(before)
    one, two = load_file(str(heads_dir / "model.safetensors")), load_file(str(straight / "heads" / "model.safetensors"))
    for k in one:
        torch.testing.assert_close(one[k], two[k], rtol=1e-4, atol=2e-6, msg=k)

    stopped, _ = _launch_fsdp(tmp_path, tiny_target_dir, tiny_text_jsonl, "resumed", stop_after=3, grad_accum=1)
    assert not (stopped / "heads").exists() and (stopped / "checkpoints" / "step-3").is_dir()
    resumed, printed = _launch_fsdp(tmp_path, tiny_target_dir, tiny_text_jsonl, "resumed", grad_accum=1, resume="auto")
    assert "resumed from" in printed
    a, b = load_file(str(straight / "heads" / "model.safetensors")), load_file(str(resumed / "heads" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k}: the resumed run's heads differ from the straight run's"
    m_straight, m_resumed = (json.loads((d / "metrics.json").read_text()) for d in (straight, resumed))
    assert m_resumed["evals"] == m_straight["evals"] and m_resumed["final_eval"] == m_straight["final_eval"]
    assert m_resumed["best"]["step"] == m_straight["best"]["step"]


@pytest.mark.parametrize("setting, value, named", [
    ("fsdp_version", 2, "fsdp_version is 2"),
    ("activation_checkpointing", True, "activation_checkpointing is on"),
    ("state_dict_type", SimpleNamespace(name="FULL_STATE_DICT"), "state_dict_type is FULL_STATE_DICT"),
])
def test_fsdp_settings_draftheads_cannot_train_with_are_named(setting, value, named):
    plugin = SimpleNamespace(fsdp_version=1, activation_checkpointing=False, state_dict_type=SimpleNamespace(name="SHARDED_STATE_DICT"))
    check_fsdp_plugin(plugin)  # the shipped settings pass
    setattr(plugin, setting, value)
    with pytest.raises(FSDPSetupError, match=named) as err:
        check_fsdp_plugin(plugin)
    assert "configs/accelerate/fsdp.yaml" in str(err.value)
