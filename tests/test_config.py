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
    assert cfg.heads.num_heads == 3 and cfg.heads.num_layers == 1 and cfg.heads.head_type == "medusa"
    assert cfg.data.path == "rows.jsonl" and cfg.data.max_length == 128
    assert cfg.train.lr == pytest.approx(1e-3) and isinstance(cfg.train.lr, float)
    assert cfg.train.max_steps == 10 and cfg.train.loss_decay == 0.8 and cfg.train.topk == 5


def test_empty_file_gives_defaults(tmp_path):
    cfg = load_config(_write(tmp_path, ""))
    assert cfg.target.name_or_path == "smollm2" and cfg.data.path is None  # a run names its data
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
    with pytest.raises(ConfigError, match="heads.head_type: unknown head type 'eagle9'; valid: .*medusa"):
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
    assert cfg.data.max_length == 300 and cfg.data.split == "train" and cfg.data.path is None


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


@pytest.mark.parametrize("name", ["llama3.1-8b-instruct.yaml", "qwen2.5-7b-instruct.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "configs" / name)
    assert cfg.heads.head_type == "medusa"


# -- YAML 1.1 traps: only true/false are booleans, in overrides and in files alike --------------


@pytest.mark.parametrize("word", ["no", "yes", "on", "off", "No", "OFF", "y", "n"])
def test_yaml_11_boolean_words_stay_strings_in_string_fields(tmp_path, word):
    assert parse_override(f"tracking.run_name={word}") == ("tracking.run_name", word)
    assert config_from_dict({}, [f"tracking.run_name={word}"]).tracking.run_name == word
    assert load_config(_write(tmp_path, f"tracking: {{run_name: {word}}}\n")).tracking.run_name == word


def test_mixed_precision_no_is_the_string_no(tmp_path):
    assert config_from_dict({}, ["train.mixed_precision=no"]).train.mixed_precision == "no"
    assert load_config(_write(tmp_path, "train: {mixed_precision: no}\n")).train.mixed_precision == "no"


@pytest.mark.parametrize("text, value", [("true", True), ("false", False), ("True", True), ("FALSE", False)])
def test_bool_fields_take_true_and_false(text, value):
    assert config_from_dict({}, [f"target.trust_remote_code={text}"]).target.trust_remote_code is value


@pytest.mark.parametrize("word", ["yes", "no", "on", "off", "1"])
def test_bool_fields_refuse_other_words_naming_the_type(word):
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, [f"target.trust_remote_code={word}"])
    assert f"override 'target.trust_remote_code={word}': target.trust_remote_code: expected bool (true or false)" in str(e.value)


def test_numbers_parse_as_yaml_12(tmp_path):
    assert parse_override("a=1e-3") == ("a", 1e-3) and parse_override("a=-2.5E+2") == ("a", -250.0)
    assert parse_override("a=.5") == ("a", 0.5) and parse_override("a=1_000") == ("a", 1000)
    assert parse_override("a=0x10") == ("a", 16)
    assert parse_override("a=1:30") == ("a", "1:30")  # YAML 1.1: base 60, 90
    assert parse_override("a=010") == ("a", "010")  # YAML 1.1: octal, 8
    assert parse_override("a=~") == ("a", None)
    cfg = load_config(_write(tmp_path, "train: {lr: 2e-4, max_grad_norm: '1e-1'}\n"))  # a quoted float still reads
    assert isinstance(cfg.train.lr, float) and cfg.train.lr == 2e-4 and cfg.train.max_grad_norm == 0.1


# -- error messages: key path, "did you mean", the type or bound expected ------------------------


@pytest.mark.parametrize(
    "data, overrides, expected",
    [
        ({"heads": {"feature_layers": [1, "a"]}}, (), "heads.feature_layers[1]: expected int, got str 'a'"),
        ({"train": {"loss_decay": 1.5}}, (), "train.loss_decay must be <= 1, got 1.5"),
        ({"train": {"lr": 0}}, (), "train.lr must be > 0, got 0"),
        ({"train": {"max_steps": 0}}, (), "train.max_steps must be >= 1 or null, got 0"),
        ({"heads": {"head_type": "eagle3", "draft_vocab_size": 0}}, (), "heads.draft_vocab_size must be >= 1 or null"),
        ({}, ("data.max_length=eight",), "override 'data.max_length=eight': data.max_length: expected int, got str 'eight'"),
        ({}, ("data.chunk_text=yes",), "data.chunk_text: expected bool (true or false), got str 'yes'"),
        ({"train": {"batch_size": True}}, (), "train.batch_size: expected int, got bool True"),
        ({"tracking": {"run_name": 5}}, (), "tracking.run_name: expected str or null, got int 5"),
        ({}, ("tracking.report_to=tensorbord",), "tracking.report_to: expected one of 'none', 'wandb', 'tensorboard'"),
        ({}, ("heads.nose=0.2",), "override 'heads.nose=0.2': unknown config key 'heads.nose' (did you mean 'heads.noise'?)"),
        ({"traking": {}}, (), "unknown config key 'traking' (did you mean 'tracking'?); valid keys at the top level: target, heads"),
    ],
)
def test_error_messages_name_key_and_what_is_expected(data, overrides, expected):
    with pytest.raises(ConfigError) as e:
        config_from_dict(data, overrides)
    assert expected in str(e.value)


def test_every_bad_key_is_reported_at_once():
    with pytest.raises(ConfigError) as e:
        config_from_dict({"train": {"lrr": 1, "batch_size": "8"}})
    assert "unknown config key 'train.lrr' (did you mean 'train.lr'?)" in str(e.value)
    assert "train.batch_size: expected int, got str '8'" in str(e.value)


def test_file_errors_name_the_file(tmp_path):
    path = _write(tmp_path, "train: {batch_size: 8.5}\n")
    with pytest.raises(ConfigError, match=f"^{path}: train.batch_size: expected int, got float 8.5"):
        load_config(path)


# -- heads.head_type is the one name (as in a heads folder's config.json); heads.type still reads --


def test_old_key_heads_type_still_reads_in_files_and_overrides(tmp_path):
    assert load_config(_write(tmp_path, "heads: {type: hydra}\n")).heads.head_type == "hydra"
    assert config_from_dict({}, ["heads.type=hydra"]).heads.head_type == "hydra"
    assert config_from_dict({"heads": {"head_type": "medusa"}}, ["heads.type=hydra"]).heads.head_type == "hydra"
    assert "type" not in config_from_dict({"heads": {"type": "hydra"}}).to_dict()["heads"]


def test_old_and_new_head_type_keys_together_are_refused():
    with pytest.raises(ConfigError, match="heads.type is the old name of heads.head_type: give only heads.head_type"):
        config_from_dict({"heads": {"type": "hydra", "head_type": "medusa"}})


def test_resume_check_reads_a_run_saved_with_the_old_key():
    from draftheads.train.run_dir import RunFolderError, check_resume_config

    current = config_from_dict({"heads": {"head_type": "hydra"}}).to_dict()
    saved = {**current, "heads": {("type" if k == "head_type" else k): v for k, v in current["heads"].items()}}
    check_resume_config(Path("ckpt"), saved, current)  # same config, old spelling: no error
    saved["heads"]["type"] = "medusa"
    with pytest.raises(RunFolderError, match="heads.head_type: 'medusa' in the checkpoint, 'hydra' now"):
        check_resume_config(Path("ckpt"), saved, current)


def test_data_config_checks_types_when_built_directly():
    from draftheads.data import DataConfig

    with pytest.raises(ValueError, match="chunk_text"):
        DataConfig(path="x", chunk_text="yes")
    with pytest.raises(ValueError, match="unexpected keyword argument|Unexpected keyword"):
        DataConfig(path="x", max_lenght=8)
