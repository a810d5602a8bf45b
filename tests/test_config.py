"""Experiment config: YAML -> dataclasses, strict keys and types, key.sub=value overrides."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftheads.config import ConfigError, ExperimentConfig, config_from_dict, load_config, parse_override

REPO = Path(__file__).resolve().parents[1]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_defaults_and_nested_values(tmp_path):
    cfg = load_config(
        _write(
            tmp_path,
            """
target: {name_or_path: some/model, dtype: bf16}
heads: {num_heads: 3, lm_head: own}
data: {path: rows.jsonl, format: text, max_length: 128}
train: {lr: 1e-3, max_steps: 10}   # PyYAML reads 1e-3 as a string: accepted for float fields
tracking: {report_to: none}
""",
        )
    )
    assert isinstance(cfg, ExperimentConfig)
    assert cfg.target.name_or_path == "some/model" and cfg.target.dtype == "bf16"
    assert cfg.target.attn_implementation == "sdpa" and cfg.target.trust_remote_code is False
    assert cfg.heads.num_heads == 3 and cfg.heads.num_layers == 1 and cfg.heads.type == "medusa"
    assert cfg.data.path == "rows.jsonl" and cfg.data.max_length == 128
    assert cfg.train.lr == pytest.approx(1e-3) and isinstance(cfg.train.lr, float)
    assert cfg.train.max_steps == 10 and cfg.train.loss_decay == 0.8 and cfg.train.topk == 5


def test_empty_file_gives_defaults(tmp_path):
    cfg = load_config(_write(tmp_path, ""))
    assert cfg.target.name_or_path == "demo" and cfg.data.path == "demo"
    assert cfg.train.lr == 1e-3 and cfg.tracking.report_to == "none"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("trian: {lr: 1.0}\n", "unknown config key 'trian'"),
        ("train: {lrr: 1.0}\n", "unknown config key 'train.lrr'"),
        ("data: {path: x.jsonl, max_lenght: 8}\n", "unknown config key 'data.max_lenght'"),
        ("target: {dtipe: bf16}\n", "unknown config key 'target.dtipe'"),
    ],
)
def test_unknown_key_names_full_dotted_key_and_valid_keys(tmp_path, text, expected):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    msg = str(e.value)
    assert expected in msg
    assert "valid keys" in msg and "did you mean" in msg


def test_unknown_nested_key_lists_the_section_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"valid keys under 'train': output_dir, max_steps"):
        load_config(_write(tmp_path, "train: {bogus: 1}\n"))


@pytest.mark.parametrize(
    "text, key, expected",
    [
        ("train: {batch_size: eight}\n", "train.batch_size", "int"),
        ("train: {batch_size: 8.5}\n", "train.batch_size", "int"),
        ("train: {lr: fast}\n", "train.lr", "float"),
        ("target: {trust_remote_code: 'yes'}\n", "target.trust_remote_code", "bool"),
        ("train: {mixed_precision: bf32}\n", "train.mixed_precision", "one of 'auto', 'no', 'bf16', 'fp16'"),
        ("heads: {lm_head: tied}\n", "heads.lm_head", "one of 'auto', 'own', 'shared'"),
        ("data: {path: x.jsonl, max_length: long}\n", "data.max_length", "int"),
        ("train: 5\n", "train", "mapping"),
    ],
)
def test_wrong_type_names_key_and_expected_type(tmp_path, text, key, expected):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    assert key in str(e.value) and expected in str(e.value)


def test_semantic_checks_name_the_key():
    with pytest.raises(ConfigError, match="heads.type: unknown head type 'eagle9'; valid: .*medusa"):
        config_from_dict({"heads": {"type": "eagle9"}})
    with pytest.raises(ConfigError, match="train.grad_accum must be >= 1"):
        config_from_dict({"train": {"grad_accum": 0}})
    with pytest.raises(ConfigError, match="data.max_length"):
        config_from_dict({"data": {"path": "x.jsonl", "max_length": 1}})


def test_overrides_apply_with_yaml_scalars(tmp_path):
    path = _write(tmp_path, "train: {lr: 0.01, max_steps: 5}\ndata: {path: rows.jsonl}\n")
    cfg = load_config(
        path,
        [
            "train.lr=3e-4",
            "train.max_steps=null",
            "train.num_epochs=2",
            "heads.lm_head=shared",
            "target.trust_remote_code=true",
            "data.max_length=64",  # keeps data.path from the file
            "tracking.run_name=my run",
        ],
    )
    assert cfg.train.lr == pytest.approx(3e-4) and cfg.train.max_steps is None and cfg.train.num_epochs == 2
    assert cfg.heads.lm_head == "shared" and cfg.target.trust_remote_code is True
    assert cfg.data.path == "rows.jsonl" and cfg.data.max_length == 64
    assert cfg.tracking.run_name == "my run"


def test_override_of_a_section_absent_from_the_file_keeps_its_defaults():
    cfg = config_from_dict({}, ["data.max_length=300"])
    assert cfg.data.path == "demo" and cfg.data.max_length == 300


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.lrr=1", "override 'train.lrr=1': unknown config key 'train.lrr'"),
        ("trainn.lr=1", "unknown config key 'trainn'"),
        ("data.pathh=x", "unknown config key 'data.pathh'"),
        ("train.lr=abc", "override 'train.lr=abc': train.lr: expected float"),
        ("train.batch_size=2.5", "train.batch_size: expected int"),
        ("train.lr.x=1", "'train.lr' is a value"),
        ("train.lr", "must look like key.sub=value"),
    ],
)
def test_bad_overrides(override, expected):
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, [override])
    assert expected in str(e.value)


def test_parse_override_values():
    assert parse_override("a.b=1") == ("a.b", 1)
    assert parse_override("a.b=1.5") == ("a.b", 1.5)
    assert parse_override("a.b=null") == ("a.b", None)
    assert parse_override("a.b=") == ("a.b", None)
    assert parse_override("a.b=x=y") == ("a.b", "x=y")


def test_missing_config_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_not_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))


@pytest.mark.parametrize("name", ["demo.yaml", "llama3.1-8b-instruct.yaml", "qwen2.5-7b-instruct.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.heads.type == "medusa"
