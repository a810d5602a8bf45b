"""Tests for the offline demo target builder, on a tiny spec that builds in a few seconds."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

from draftheads import demo
from draftheads.demo import build as demo_build
from draftheads.demo import corpus as demo_corpus

TINY = demo.DemoTargetSpec(
    vocab_size=300,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    intermediate_size=64,
    seq_len=64,
    batch_size=4,
    max_tokens=4096,
    max_files=12,
    eval_max_tokens=2048,
    num_threads=1,
)

SNIPPET = 'class Foo:\n\tdef bar(self, x: int) -> str:\n        return f"{x!r} é 中文"  # comment\n\n'


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return demo.build_demo_target(tmp_path_factory.mktemp("demo") / "target", TINY, progress=False)


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[pathlib.Path]:
    """Record every real build, so tests can assert that a cached folder was reused."""
    calls: list[pathlib.Path] = []
    original = demo_build._build_into

    def counting(folder, spec, progress):
        calls.append(folder)
        return original(folder, spec, progress)

    monkeypatch.setattr(demo_build, "_build_into", counting)
    return calls


def test_loads_with_auto_classes(built: pathlib.Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(built)
    tokenizer = AutoTokenizer.from_pretrained(built)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert tokenizer.bos_token == demo.BOS and tokenizer.eos_token == demo.EOS and tokenizer.pad_token == demo.PAD
    assert model.config.eos_token_id == tokenizer.eos_token_id
    ids = tokenizer(SNIPPET, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_tokenizer_round_trips_code(built: pathlib.Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built)
    ids = tokenizer(SNIPPET).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == SNIPPET
    plain = tokenizer(SNIPPET, add_special_tokens=False).input_ids
    assert tokenizer.decode(plain) == SNIPPET


def test_splits_disjoint_stable_and_clean() -> None:
    train, heldout = demo.corpus_files("train"), demo.corpus_files("heldout")
    assert train and heldout
    assert not set(train) & set(heldout)
    assert sorted(train + heldout) == sorted(demo.corpus_files("all"))
    assert demo.corpus_files("heldout") == heldout and demo.corpus_files("train") == train
    assert 0.01 < len(heldout) / (len(train) + len(heldout)) < 0.15
    for path in train + heldout:
        parts = set(path.relative_to(demo.stdlib_root()).parts[:-1])
        assert not parts & {"test", "tests", "idle_test", "site-packages"}, path
    with pytest.raises(ValueError, match="split"):
        demo.corpus_files("validation")


def test_split_rule_is_pinned() -> None:
    """The split must not depend on Python's per-process salted hash(): pin a few known answers."""
    held = ["copy.py", "dis.py", "collections/__init__.py", "asyncio/base_subprocess.py"]
    kept = ["os.py", "typing.py", "json/decoder.py"]
    assert all(demo.is_heldout(p) for p in held)
    assert not any(demo.is_heldout(p) for p in kept)


def test_same_seed_gives_bit_identical_weights(built: pathlib.Path, tmp_path: pathlib.Path) -> None:
    again = demo.build_demo_target(tmp_path / "again", TINY, progress=False)
    first, second = load_file(built / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert (built / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()


def test_metadata_records_the_build(built: pathlib.Path) -> None:
    meta = json.loads((built / demo.METADATA_FILE).read_text())
    assert math.isfinite(meta["heldout_loss"]) and 0 < meta["heldout_loss"] < math.log(TINY.vocab_size) + 1
    assert meta["seed"] == TINY.seed
    assert meta["tokens_trained"] == TINY.max_tokens
    assert meta["build_key"] == TINY.build_key()
    assert meta["corpus"]["python_version"] == ".".join(map(str, sys.version_info[:3]))
    heldout = demo_corpus._relative(demo.corpus_files("heldout", max_files=TINY.max_files))
    assert meta["files"]["heldout"] == heldout
    assert meta["files"]["heldout_count"] == len(heldout)
    assert meta["files"]["train_count"] == TINY.max_files
    assert demo.is_complete(built, TINY)


def test_ensure_reuses_a_complete_folder(built: pathlib.Path, tmp_path: pathlib.Path, monkeypatch) -> None:
    target = demo.default_target_dir(TINY, tmp_path)
    shutil.copytree(built, target)
    mtime = (target / "model.safetensors").stat().st_mtime_ns
    calls = _count_builds(monkeypatch)
    assert demo.ensure_demo_target(TINY, cache_dir=tmp_path, progress=False) == target
    assert calls == []
    assert (target / "model.safetensors").stat().st_mtime_ns == mtime


def test_ensure_ignores_and_clears_interrupted_builds(tmp_path: pathlib.Path, monkeypatch) -> None:
    target = demo.default_target_dir(TINY, tmp_path)
    stale = target.parent / f"{target.name}.tmp-interrupted"
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}")
    calls = _count_builds(monkeypatch)
    folder = demo.ensure_demo_target(TINY, cache_dir=tmp_path, progress=False)
    assert folder == target and len(calls) == 1
    assert demo.is_complete(folder, TINY)
    assert not stale.exists()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [target.name]


def test_ensure_rebuilds_a_folder_without_metadata(built: pathlib.Path, tmp_path: pathlib.Path, monkeypatch) -> None:
    target = demo.default_target_dir(TINY, tmp_path)
    shutil.copytree(built, target)
    (target / demo.METADATA_FILE).unlink()
    calls = _count_builds(monkeypatch)
    assert demo.ensure_demo_target(TINY, cache_dir=tmp_path, progress=False) == target
    assert len(calls) == 1 and demo.is_complete(target, TINY)


def test_cache_location_follows_env_and_spec(tmp_path: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setenv("DRAFTHEADS_CACHE", str(tmp_path))
    folder = demo.default_target_dir(TINY)
    assert folder.parent == tmp_path and folder.name.startswith("demo-target-")
    assert demo.default_target_dir(dataclasses.replace(TINY, seed=1)) != folder
    assert demo.default_target_dir(dataclasses.replace(TINY, num_threads=2)) == folder
    assert demo.default_target_dir(TINY) == folder


def test_resolve_target(monkeypatch, tmp_path: pathlib.Path) -> None:
    assert demo.resolve_target("meta-llama/Llama-3.2-1B") == "meta-llama/Llama-3.2-1B"
    assert demo.resolve_target("/some/path") == "/some/path"
    monkeypatch.setattr(demo_build, "ensure_demo_target", lambda *a, **k: tmp_path)
    assert demo.resolve_target(demo.DEMO_TARGET) == str(tmp_path)


def test_learning_rate_schedule() -> None:
    spec = demo.DemoTargetSpec(lr=1e-3, warmup_fraction=0.1, min_lr_ratio=0.1)
    lrs = [demo.lr_at(step, 100, spec) for step in range(100)]
    assert lrs[0] < lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-4, rel=0.05)


def test_command_line_shape_flags_make_their_own_spec() -> None:
    import argparse

    from draftheads.demo.__main__ import spec_from_args

    args = argparse.Namespace(num_layers=12, hidden_size=160, max_tokens=None, num_heads=None,
                              intermediate_size=None, num_threads=None)
    spec = spec_from_args(args)
    default = demo.DemoTargetSpec()
    assert (spec.num_layers, spec.hidden_size, spec.max_tokens) == (12, 160, default.max_tokens)
    assert spec.build_key() != default.build_key()  # its own cache folder
