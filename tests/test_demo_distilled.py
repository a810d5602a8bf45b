"""``data.path: demo-distilled``: the demo corpus continued by the demo target, built once and cached."""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from draftheads import demo
from draftheads.data.config import DataConfig
from draftheads.data import demo_distilled as distilled
from draftheads.data import build_datasets
from draftheads.data.load import load_raw_dataset
from draftheads.target import load_target

TINY = demo.DemoTargetSpec(
    vocab_size=300, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seq_len=64,
    batch_size=4, max_tokens=4096, max_files=12, eval_max_tokens=2048, num_threads=1,
)
SMALL = distilled.DistilledSpec(files=2, chunk_tokens=48, prompt_tokens=8, new_tokens=6, batch_size=16)


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return demo.build_demo_target(tmp_path_factory.mktemp("demo") / "demo-target-tiny", TINY, progress=False)


def _texts(path: pathlib.Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def test_builds_one_row_per_chunk_beside_the_target_and_reuses_it(target, monkeypatch) -> None:
    out = distilled.ensure_distilled(SMALL, target_dir=target, progress=False)
    assert out.parent == target.parent and out.name.startswith(target.name) and out.suffix == ".jsonl"
    _, tokenizer = load_target(str(target))
    chunks = distilled.corpus_chunks(tokenizer, SMALL)
    texts = _texts(out)
    assert len(chunks) >= 4 and len(texts) == len(chunks)
    assert not list(target.parent.glob(f".{out.name}.tmp*"))  # installed by rename: nothing half-written is left
    assert not set(texts) & set(chunks)  # every row was continued by the target, none is a corpus chunk

    def no_rebuild(*args, **kwargs):
        raise AssertionError("a finished set was built again")

    monkeypatch.setattr(distilled, "build_distilled", no_rebuild)
    assert distilled.ensure_distilled(SMALL, target_dir=target, progress=False) == out


def test_same_spec_gives_the_same_rows_and_another_spec_another_file(target, tmp_path) -> None:
    first = distilled.ensure_distilled(SMALL, target_dir=target, progress=False)
    copy = tmp_path / target.name
    shutil.copytree(target, copy)
    again = distilled.ensure_distilled(SMALL, target_dir=copy, progress=False)
    assert _texts(again) == _texts(first)  # greedy and seeded sampling: a rebuild is the same set
    other = distilled.DistilledSpec(**{**SMALL.__dict__, "new_tokens": 4})
    assert distilled.distilled_path(target, other) != first


def test_is_the_training_source_and_refuses_to_evaluate_on_itself(target, monkeypatch) -> None:
    built = distilled.ensure_distilled(SMALL, target_dir=target, progress=False)
    monkeypatch.setattr(distilled, "ensure_distilled", lambda *a, **k: built)
    cfg = DataConfig(path="demo-distilled", eval_path="demo", eval_split="heldout")
    resolved = distilled.resolve_data_path(cfg)
    assert resolved.path == str(built) and resolved.eval_path == "demo"
    assert load_raw_dataset(resolved)["text"] == _texts(built)
    _, tokenizer = load_target(str(target))
    train, heldout, stats = build_datasets(
        DataConfig(path="demo-distilled", eval_path="demo", eval_split="heldout", max_length=32, chunk_text=False,
                   max_samples=4), tokenizer)
    assert len(train) > 0 and heldout is not None and len(heldout) > 0
    with pytest.raises(ValueError, match="eval_path: demo"):  # a config that forgot eval_path
        distilled.resolve_data_path(DataConfig(path="demo-distilled", eval_split="heldout"))
    assert distilled.resolve_data_path(DataConfig(path="demo")) == DataConfig(path="demo")  # others untouched


def test_a_killed_build_leaves_nothing_that_counts(target) -> None:
    spec = distilled.DistilledSpec(**{**SMALL.__dict__, "seed": 1})
    out = distilled.distilled_path(target, spec)
    (out.parent / f".{out.name}.tmp-abc").mkdir()  # what a build killed mid-distillation leaves
    (out.parent / f".{out.name}.tmp-def").write_text('{"text": "half a row')  # ... or mid-write
    assert not out.exists()  # a leftover is never taken for the set
    distilled.ensure_distilled(spec, target_dir=target, progress=False)
    assert out.is_file() and not list(out.parent.glob(f".{out.name}.tmp*"))
    assert all(json.loads(line)["text"] for line in out.read_text().splitlines())
