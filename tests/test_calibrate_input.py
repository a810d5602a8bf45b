"""Bad calibration input is refused before any work: questions rows, numeric flags, an unwritable
heads folder; and generate's max_new_tokens must be a whole number."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

import draftheads as dh
from draftheads.cli import main

from inference_utils import tiny_target


@pytest.fixture(scope="module")
def heads_dir(tiny_target_dir, tmp_path_factory):
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    path = tmp_path_factory.mktemp("heads") / "heads"
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(path)
    return path


def calibrate_args(target_dir, heads_dir, *extra):
    return ["calibrate", "--target", str(target_dir), "--heads", str(heads_dir), "--new-tokens", "4",
            "--max-nodes", "4", "--no-chat-template", *extra]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"turns": "def f(self):"}, "'turns' must be a non-empty list of non-empty strings, got 'def f"),
        ({"turns": []}, "'turns' must be a non-empty list"),
        ({"turns": [3]}, "'turns' must be a non-empty list of non-empty strings"),
        (["def f(self):"], "expected a JSON object with 'turns', 'prompt' or 'text', got list"),
        ({"prompt": ["x"]}, "'prompt' must be a non-empty string"),
    ],
)
def test_bad_questions_row_is_refused_naming_file_and_line(tiny_target_dir, heads_dir, tmp_path, row, message):
    """A string `turns` used to calibrate on its first character; it is refused, as bench does."""
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"turns": ["import os"]}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(SystemExit, match=f"q.jsonl:2: {message}"):
        main(calibrate_args(tiny_target_dir, heads_dir, "--prompts", str(prompts), "--dry-run"))


@pytest.mark.parametrize("flag", ["--prompt-tokens", "--num-prompts", "--new-tokens", "--max-nodes"])
def test_non_positive_counts_are_refused(tiny_target_dir, heads_dir, flag, capsys):
    """--prompt-tokens 0 used to keep whole prompts (x[:, -0:] is all of x)."""
    args = calibrate_args(tiny_target_dir, heads_dir, "--dry-run")
    args = [a for i, a in enumerate(args) if a != flag and (i == 0 or args[i - 1] != flag)] + [flag, "0"]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert f"argument {flag}: must be a whole number >= 1, got 0" in capsys.readouterr().err


def test_unwritable_heads_folder_is_refused_before_calibrating(tiny_target_dir, heads_dir, monkeypatch):
    """The tests run as root, for whom chmod does not stop writes: the folder is made unwritable by
    failing every file creation in it, as the OS does for a read-only folder."""
    real_mkstemp = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == heads_dir.resolve():
            raise PermissionError(13, "Permission denied")
        return real_mkstemp(*args, dir=dir, **kwargs)

    def calibration_must_not_run(*args, **kwargs):
        raise AssertionError("calibration ran before the heads folder was found unwritable")

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr("draftheads.tune.calibrate.calibrate", calibration_must_not_run)
    with pytest.raises(SystemExit, match=f"cannot write tree.json into {heads_dir} \\(Permission denied\\)"):
        main(calibrate_args(tiny_target_dir, heads_dir))


@pytest.mark.parametrize("bad", [2.5, "3", True])
def test_max_new_tokens_must_be_a_whole_number(bad):
    target = tiny_target("llama")
    decoder = dh.SpeculativeDecoder(target, dh.MedusaHeads.for_target(target, num_heads=2))
    with pytest.raises(ValueError, match="max_new_tokens must be a whole number"):
        decoder.generate([1, 5, 7], max_new_tokens=bad)


def test_cli_max_new_tokens_must_be_a_whole_number(tiny_target_dir, heads_dir, capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompt", "x",
              "--max-new-tokens", "2.5"])
    assert "argument --max-new-tokens: expected a whole number >= 1, got '2.5'" in capsys.readouterr().err
