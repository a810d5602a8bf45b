"""`draftheads generate` and `draftheads calibrate` end to end on a tiny saved model."""
from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

import draftheads as dh
from draftheads.cli import main


@pytest.fixture(scope="module")
def heads_dir(tiny_target_dir, tmp_path_factory):
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    path = tmp_path_factory.mktemp("heads") / "heads"
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(path)
    return path


def test_generate_streams_and_reports(tiny_target_dir, heads_dir, capsys):
    code = main([
        "generate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompt", "def f(self, x):",
        "--max-new-tokens", "12", "--no-chat-template",
    ])
    assert code == 0
    captured = capsys.readouterr()
    assert "tokens/s" in captured.err and "tokens per target forward" in captured.err


def test_generate_matches_plain_generate_text(tiny_target_dir, heads_dir, tiny_tokenizer, capsys):
    main(["generate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompt", "for x in y:",
          "--max-new-tokens", "10", "--no-chat-template", "--quiet"])
    printed = capsys.readouterr().out.strip()
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    ids = tiny_tokenizer("for x in y:", return_tensors="pt").input_ids
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                          pad_token_id=tiny_tokenizer.pad_token_id)
    assert printed == tiny_tokenizer.decode(ref[0, ids.shape[1]:], skip_special_tokens=True).strip()


def test_generate_with_a_draft_model_reports_its_draft_lengths(tiny_target_dir, tiny_tokenizer, capsys):
    """The target as its own draft (same tokenizer, always accepted): exact text, and a second
    report line with the draft budget's choices and the draft lengths."""
    main(["generate", "--target", str(tiny_target_dir), "--draft-model", str(tiny_target_dir), "--prompt", "for x in y:",
          "--max-new-tokens", "10", "--no-chat-template", "--quiet"])
    captured = capsys.readouterr()
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    ids = tiny_tokenizer("for x in y:", return_tensors="pt").input_ids
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                          pad_token_id=tiny_tokenizer.pad_token_id)
    assert captured.out.strip() == tiny_tokenizer.decode(ref[0, ids.shape[1]:], skip_special_tokens=True).strip()
    # How many steps go plain is a timing decision (the draft budget compares measured step
    # times), so the test checks that the counts are reported, not their values.
    assert re.search(r"draft budget: \d+ full, \d+ shortened, \d+ plain steps; steps by draft length \{", captured.err)


def test_generate_needs_exactly_one_proposer(tiny_target_dir):
    with pytest.raises(SystemExit, match="give one of --heads DIR, --draft-model"):
        main(["generate", "--target", str(tiny_target_dir), "--prompt", "x"])
    with pytest.raises(SystemExit, match="give one of --heads DIR, --draft-model"):
        main(["generate", "--target", str(tiny_target_dir), "--prompt", "x", "--prompt-lookup",
              "--draft-model", str(tiny_target_dir)])


def test_generate_with_heads_and_prompt_lookup_is_exact(tiny_target_dir, heads_dir, tiny_tokenizer, capsys):
    """--heads DIR --prompt-lookup: lookup where the text repeats, the heads elsewhere; greedy text is generate's."""
    prompt = "for x in y: for x in y: for x in"
    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    ids = tiny_tokenizer(prompt, return_tensors="pt").input_ids
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                          pad_token_id=tiny_tokenizer.pad_token_id)
    expected = tiny_tokenizer.decode(ref[0, ids.shape[1]:], skip_special_tokens=True).strip()
    for flag in ("--prompt-lookup", "--no-prompt-lookup"):  # every request behind lookup; the heads alone
        main(["generate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), flag, "--prompt", prompt,
              "--max-new-tokens", "12", "--no-chat-template", "--quiet", "--temperature", "0"])
        captured = capsys.readouterr()
        assert captured.out.strip() == expected, flag
        said = re.search(r"\[prompt lookup in front of the heads \(prompt_lookup argument\): (\d+) steps drafted by "
                         r"lookup, (\d+) by the heads\]", captured.err)
        assert (said is not None) == (flag == "--prompt-lookup"), captured.err


def test_calibrate_writes_tree_json(tiny_target_dir, heads_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "code", "turns": [f"def f{i}(self):"]})
                                 for i in range(3)) + "\n")
    code = main(["calibrate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompts", str(prompts),
                 "--new-tokens", "8", "--max-nodes", "6", "--no-chat-template"])
    assert code == 0
    saved = json.loads((heads_dir / "tree.json").read_text())
    (entry,) = saved["plans"]  # one greedy entry for this device type
    assert entry["device_type"] == "cpu" and entry["temperature"] == 0 and entry["chosen_by"] == "calibrate"
    assert "verify_seconds" in entry["measured"] and "accuracy" in entry["measured"]
    assert "chosen tree" in capsys.readouterr().out


def test_calibrate_reports_malformed_prompt_line(tiny_target_dir, heads_dir, tmp_path):
    prompts = tmp_path / "bad.jsonl"
    prompts.write_text('{"turns": ["ok"]}\n{not json\n')
    with pytest.raises(SystemExit, match="bad.jsonl:2"):
        main(["calibrate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompts", str(prompts)])


def test_a_missing_target_folder_is_a_message_naming_it(tmp_path, heads_dir, capsys):
    """transformers raised a bare OSError (after a minute of Hub retries offline) for a typo'd path."""
    missing = tmp_path / "nonexistent"
    assert main(["generate", "--target", str(missing), "--heads", str(heads_dir), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(missing) in err and "no such folder" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert main(["generate", "--target", str(tmp_path / "empty"), "--heads", str(heads_dir), "--prompt", "x"]) == 2
    assert "has no config.json" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_generate_refuses_a_temperature_generate_refuses(tiny_target_dir, heads_dir, value, capsys):
    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompt", "x",
                 "--max-new-tokens", "3", "--no-chat-template", f"--temperature={value}"])
    assert code == 2
    assert "error: temperature must be" in capsys.readouterr().err


def test_import_needs_a_target_and_offers_no_prompt_options(tmp_path, capsys):
    """Without --target, import used to start building the default target (an hour on a busy machine)."""
    with pytest.raises(SystemExit) as exit_:
        main(["import", str(tmp_path / "src"), str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "--target" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    help_text = capsys.readouterr().out
    assert "--target" in help_text and "--no-chat-template" not in help_text


def test_heads_without_a_fingerprint_need_the_named_opt_out(tiny_target_dir, heads_dir, tmp_path, capsys):
    import shutil

    edited = shutil.copytree(heads_dir, tmp_path / "edited")
    cfg = json.loads((edited / "config.json").read_text())
    del cfg["target"]["lm_head_fingerprint"]
    (edited / "config.json").write_text(json.dumps(cfg))
    args = ["generate", "--target", str(tiny_target_dir), "--heads", str(edited), "--prompt", "x",
            "--max-new-tokens", "3", "--no-chat-template", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "lm_head_fingerprint" in err and "--no-fingerprint-check" in err and "Traceback" not in err
    assert main(args + ["--no-fingerprint-check"]) == 0


_HEAVY = ("torch", "transformers", "datasets", "accelerate")
_WHAT_LOADED = """
import sys
{code}
print("LOADED:", *sorted(m for m in {heavy} if m in sys.modules))
"""


def _modules_loaded_by(code: str) -> list[str]:
    """The heavy libraries a fresh interpreter holds after ``code`` (not timed: what was imported)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", _WHAT_LOADED.format(code=code, heavy=_HEAVY)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()[-1].split()[1:]  # after the help texts: the LOADED line


def test_import_and_help_load_no_torch_or_transformers():
    """`draftheads --help` took 3+ s and `import draftheads` 2 s, all of it importing torch,
    transformers and datasets that neither needs."""
    assert _modules_loaded_by("import draftheads") == []
    helps = "\n".join(
        f"try:\n    main([{', '.join(repr(a) for a in args)}])\nexcept SystemExit:\n    pass"
        for args in (["--help"], ["train", "--help"], ["generate", "--help"], ["import", "--help"], ["export", "--help"])
    )
    assert _modules_loaded_by("from draftheads.cli import main\n" + helps) == []
    # the public API is unchanged: every exported name resolves (and then loads torch)
    assert _modules_loaded_by("import draftheads as dh\nassert all(getattr(dh, n) is not None for n in dh.__all__)\n"
                              "assert dh.SpeculativeDecoder.__name__ == 'SpeculativeDecoder'") == ["torch", "transformers"]


def test_top_level_help_lists_every_command(capsys):
    from draftheads.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert {"train", "generate", "calibrate", "bench", "distill", "cache-features", "export", "import"} <= set(commands)
    for name in commands:  # the summary line under the usage (it named 4 of the 8)
        assert name in parser.description, name
    with pytest.raises(SystemExit):
        main(["--help"])
    assert " ".join(parser.description.split()[:3]) in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("flag, drawn", [([], True), (["--top-k-drafts"], False)])
def test_generate_draws_drafts_unless_told_to_draft_top_k(tiny_target_dir, heads_dir, monkeypatch, flag, drawn):
    made = []
    real = dh.SpeculativeDecoder

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(dh, "SpeculativeDecoder", recording)
    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(heads_dir), "--prompt", "def f(x):",
                 "--max-new-tokens", "6", "--no-chat-template", "--quiet", "--temperature", "0.8", *flag])
    assert code == 0 and [d.draw_drafts for d in made] == [drawn]
