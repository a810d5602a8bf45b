"""The home-made demo target (a 5M code model trained on the standard library) and its corpora are
retired: the defaults name the real small target, a config or command that still says "demo" is
an error naming the replacement (never a Hub look-up of a model called "demo"), and training data
has no default."""
from __future__ import annotations

import pytest

from draftheads import smollm2
from draftheads.cli import build_parser, main
from draftheads.config import ConfigError, ExperimentConfig, config_from_dict, load_config
from draftheads.data import DataConfig, load_raw_dataset
from draftheads.data.load import check_eval_source
from draftheads.target import TargetLoadError, check_target_source, load_target, resolve_target


@pytest.fixture
def no_hub(monkeypatch):
    """Any attempt to reach the Hub fails the test (the refusal must come first)."""
    import transformers

    def hub(*args, **kwargs):
        raise AssertionError(f"tried to load {args[:1]} from the Hub")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", hub)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", hub)


def test_the_defaults_name_the_real_small_target():
    assert ExperimentConfig().target.name_or_path == "smollm2"
    for command in (["generate", "--prompt", "x"], ["bench"], ["calibrate", "--heads", "h"]):
        assert build_parser().parse_args(command).target == "smollm2"


@pytest.mark.parametrize("call", [resolve_target, check_target_source, load_target])
def test_the_demo_target_is_refused_naming_smollm2(call, no_hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder called "demo" here
    with pytest.raises(TargetLoadError, match=r"target: 'demo' named the home-made demo target.*retired: use smollm2"):
        call("demo")


def test_a_command_naming_the_demo_target_is_one_error_line(no_hub, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--target", "demo", "--prompt-lookup", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: target: 'demo'") and "smollm2" in err and "Traceback" not in err


def test_a_folder_called_demo_is_still_a_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    assert resolve_target("demo") == "demo"
    with pytest.raises(TargetLoadError, match="has no config.json"):  # checked as the folder it is
        check_target_source("demo")


def test_a_config_naming_the_demo_target_or_its_data_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"target.name_or_path: 'demo' .*retired: use smollm2 .*configs/smollm2.yaml"):
        config_from_dict({"target": {"name_or_path": "demo"}})
    for key in ("path", "eval_path"):
        for value in smollm2.RETIRED_DATA:
            with pytest.raises(ConfigError, match=rf"data.{key}: '{value}' named the home-made demo target's data.*"
                                                  r"draftheads distill --target smollm2 --synthesize"):
                config_from_dict({"data": {"path": "rows.jsonl", key: value}})
    yaml = tmp_path / "old.yaml"
    yaml.write_text("target: {name_or_path: demo}\ndata: {path: demo}\n")
    with pytest.raises(ConfigError, match="old.yaml: .*retired"):
        load_config(yaml)


def test_data_folders_called_demo_still_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "rows.jsonl").write_text('{"text": "a b c"}\n')
    assert load_raw_dataset(DataConfig(path="demo", cache_dir=str(tmp_path / "cache")))["text"] == ["a b c"]


def test_training_data_has_no_default_and_says_how_to_name_it():
    cfg = config_from_dict({})
    assert cfg.data.path is None
    for check in (check_eval_source, load_raw_dataset):  # training runs check_eval_source before loading anything
        with pytest.raises(ValueError, match=r"data.path is not set: .*data.path=FILE.*draftheads distill"):
            check(cfg.data)


def test_a_hub_dataset_keeps_its_named_eval_split():
    check_eval_source(DataConfig(path="owner/chats", eval_split="validation"))  # a Hub dataset has real splits
