"""`draftheads distill --engine vllm` from the main venv: the command runs again in the vLLM venv
(vLLM pins its own torch), with this package on PYTHONPATH; without one, the error names the
set-up script."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from distill_utils import byte_chat_tokenizer

from draftheads.data import distill_command, vllm_python
from draftheads.data.distill import DistillError

ROOT = Path(__file__).resolve().parents[1]


def _parse(argv):
    from draftheads.cli import build_parser

    return build_parser().parse_args(argv)


def test_the_child_command_line_repeats_every_setting():
    argv = ["distill", "--target", "smollm2", "--synthesize", "30", "--out", "x.jsonl", "--engine", "vllm",
            "--temperature", "0,0.7", "--batch-size", "64", "--max-new-tokens", "96", "--resume", "--no-progress",
            "--prompt-top-p", "0.9", "--eval-overlap", "drop", "--seed", "3", "--dtype", "float32"]
    args = _parse(argv)
    child = distill_command.child_argv(args, "/cache/smollm2-folder")
    again = _parse(child)
    assert again.target == "/cache/smollm2-folder" and again.target_name == "smollm2"
    for key, value in vars(args).items():
        if key not in ("target", "target_name", "func", "_parser"):
            assert getattr(again, key) == value, key
    assert distill_command.settings_from(again) == distill_command.settings_from(args)  # the sidecar names "smollm2"


def test_no_vllm_anywhere_is_a_clear_error(tmp_path, monkeypatch, capsys):
    from draftheads.cli import main

    monkeypatch.setattr(distill_command, "vllm_importable", lambda: False)
    monkeypatch.setenv(vllm_python.PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    code = main(["distill", "--target", str(tmp_path), "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--engine", "vllm"])
    err = capsys.readouterr().err
    assert code == 2 and "scripts/setup_vllm_env.sh" in err and "nowhere/python does not exist" in err and "--engine hf" in err


def test_the_command_runs_in_the_vllm_python_with_the_package_and_vllm_settings(tmp_path, monkeypatch, capsys):
    from draftheads.cli import main

    record = tmp_path / "record.json"
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
        "print('child ran'); sys.exit(3)\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(distill_command, "vllm_importable", lambda: False)
    monkeypatch.setenv(vllm_python.PYTHON_ENV, str(fake))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "7")  # a user's own setting is kept
    monkeypatch.delenv(vllm_python.CHILD_FLAG, raising=False)
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "o.jsonl"
    code = main(["distill", "--target", str(tmp_path), "--data", str(data), "--out", str(out), "--engine", "vllm",
                 "--batch-size", "32"])
    assert code == 3  # the child's exit status
    seen = json.loads(record.read_text())
    assert seen["argv"][:3] == ["-m", "draftheads.cli", "distill"]
    assert seen["argv"][3:] == ["--data", str(data), "--out", str(out), "--engine", "vllm", "--batch-size", "32",
                                "--target", str(tmp_path), "--target-name", str(tmp_path)]
    env = seen["env"]
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["VLLM_CPU_KVCACHE_SPACE"] == "7"
    assert env[vllm_python.CHILD_FLAG] == "1"
    assert "running the distill in" in capsys.readouterr().out


def test_a_child_without_vllm_does_not_start_another():
    os.environ[vllm_python.CHILD_FLAG] = "1"
    try:
        with pytest.raises(DistillError, match="no module named 'vllm'"):
            vllm_python.run_in_vllm_python(["distill"])
    finally:
        del os.environ[vllm_python.CHILD_FLAG]


def _vllm_python() -> Path | None:
    try:
        return None if vllm_python.vllm_importable() else vllm_python.find_vllm_python()
    except DistillError:
        return None


@pytest.mark.slow
@pytest.mark.skipif(_vllm_python() is None, reason="no vLLM venv (scripts/setup_vllm_env.sh, or DRAFTHEADS_VLLM_PYTHON)")
def test_cli_vllm_engine_from_the_main_venv_writes_what_hf_writes(tmp_path, monkeypatch):
    """Greedy fp32 through the real vLLM venv, started from this Python: the rows (answers and
    exact ids) equal the HF engine's."""
    from conftest import make_tiny_model

    from draftheads.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = byte_chat_tokenizer()
    model = make_tiny_model("llama", vocab_size=512, hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                            pad_token_id=0, eos_token_id=2, bos_token_id=1)  # vLLM CPU: head_dim 64
    target = tmp_path / "target"
    model.save_pretrained(target)
    tok.save_pretrained(target)
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"turns": t}) + "\n" for t in (["def value", "for value in list"], ["import dict"])))
    common = ["distill", "--target", str(target), "--data", str(data), "--max-new-tokens", "6", "--dtype", "float32",
              "--no-progress"]
    assert main(common + ["--out", str(tmp_path / "hf.jsonl")]) == 0
    assert main(common + ["--out", str(tmp_path / "vllm.jsonl"), "--engine", "vllm"]) == 0
    assert (tmp_path / "vllm.jsonl").read_text() == (tmp_path / "hf.jsonl").read_text()
