"""Heads that travel: Hub ids (``org/name``) resolve through huggingface_hub's cache, offline.

No test here touches the network: the Hub cache is written in its documented layout
(``models--org--name/{blobs,snapshots/<commit>,refs/main}``) under a temporary HF_HUB_CACHE, and
huggingface_hub runs with HF_HUB_OFFLINE (set in its constants too, which it reads at import).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

import draftheads as dh
from draftheads.cli import main
from draftheads.heads.hub import HeadsNotFoundError, looks_like_hub_id, resolve_heads_folder

from conftest import make_tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hub cache in offline mode; returns a function that publishes a folder into it."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def publish(folder: Path, repo_id: str, commit: str = COMMIT) -> Path:
        repo = cache / f"models--{repo_id.replace('/', '--')}"
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        (repo / "blobs").mkdir(exist_ok=True)
        for file in sorted(folder.iterdir()):
            data = file.read_bytes()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        return snapshot

    return publish


def noisy_medusa(target, seed: int):
    heads = dh.MedusaHeads.for_target(target, num_heads=2, lm_head="own")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    return heads


def assert_same_weights(a, b):
    assert a.state_dict().keys() == b.state_dict().keys()
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key


def test_hub_id_loads_the_cached_snapshot_offline(tmp_path, hub_cache, monkeypatch):
    target = make_tiny_model("llama")
    heads = noisy_medusa(target, seed=1)
    heads.save_pretrained(tmp_path / "published")
    snapshot = hub_cache(tmp_path / "published", "someone/tiny-medusa")
    monkeypatch.chdir(tmp_path)  # no local folder called someone/tiny-medusa here
    assert resolve_heads_folder("someone/tiny-medusa") == snapshot
    assert_same_weights(heads, dh.load_heads("someone/tiny-medusa", target=target))
    from draftheads.heads import read_config

    assert read_config("someone/tiny-medusa").head_type == "medusa"


def test_a_local_folder_wins_over_a_hub_id_of_the_same_name(tmp_path, hub_cache, monkeypatch):
    target = make_tiny_model("llama")
    noisy_medusa(target, seed=1).save_pretrained(tmp_path / "published")
    hub_cache(tmp_path / "published", "someone/tiny-medusa")
    local = noisy_medusa(target, seed=2)
    local.save_pretrained(tmp_path / "someone" / "tiny-medusa")
    monkeypatch.chdir(tmp_path)
    assert_same_weights(local, dh.load_heads("someone/tiny-medusa", target=target))


def test_neither_folder_nor_hub_repo_names_both_readings(tmp_path, hub_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HeadsNotFoundError) as err:
        dh.load_heads("someone/not-published")
    message = str(err.value)
    assert "no local folder" in message and str(tmp_path / "someone" / "not-published") in message
    assert "Hugging Face Hub repo" in message and "HF_HUB_OFFLINE" in message
    with pytest.raises(FileNotFoundError, match="heads folder not found"):  # not an id: a missing path
        dh.load_heads(tmp_path / "a" / "b" / "c")


def test_revision_reads_that_snapshot(tmp_path, hub_cache, monkeypatch):
    target = make_tiny_model("llama")
    noisy_medusa(target, seed=1).save_pretrained(tmp_path / "published")
    other = "f" * 40
    hub_cache(tmp_path / "published", "someone/tiny-medusa", commit=other)
    monkeypatch.chdir(tmp_path)
    assert resolve_heads_folder("someone/tiny-medusa", revision=other).name == other
    with pytest.raises(HeadsNotFoundError, match="revision 'e{40}'"):
        resolve_heads_folder("someone/tiny-medusa", revision="e" * 40)


@pytest.mark.parametrize("name,ok", [("org/name", True), ("org/name.v2", True), ("./org", False), ("/abs/x", False),
                                     ("a/b/c", False), ("name", False), ("org/../x", False)])
def test_what_counts_as_a_hub_id(name, ok):
    assert looks_like_hub_id(name) is ok


def test_cli_export_takes_a_hub_id(tmp_path, hub_cache, monkeypatch, capsys):
    target = make_tiny_model("llama")
    noisy_medusa(target, seed=1).save_pretrained(tmp_path / "published")
    hub_cache(tmp_path / "published", "someone/tiny-medusa")
    monkeypatch.chdir(tmp_path)
    assert main(["export", "someone/tiny-medusa", str(tmp_path / "out"), "--format", "vllm"]) == 0
    metadata = json.loads((tmp_path / "out" / "draftheads_export.json").read_text())
    assert metadata["heads"] == "someone/tiny-medusa"  # the id, not a made-up local path
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_bench_names_hub_heads_by_their_head_type(tmp_path, hub_cache, monkeypatch):
    from draftheads.bench.methods import heads_method_names

    target = make_tiny_model("llama")
    noisy_medusa(target, seed=1).save_pretrained(tmp_path / "published")
    hub_cache(tmp_path / "published", "someone/tiny-medusa")
    monkeypatch.chdir(tmp_path)
    assert heads_method_names(["someone/tiny-medusa"]) == ["medusa"]


def test_calibrate_refuses_to_write_into_hub_heads(tmp_path, hub_cache, monkeypatch, capsys):
    target = make_tiny_model("llama")
    noisy_medusa(target, seed=1).save_pretrained(tmp_path / "published")
    hub_cache(tmp_path / "published", "someone/tiny-medusa")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match="--local-dir DIR"):  # before loading any target
        main(["calibrate", "--target", str(tmp_path / "no-target"), "--heads", "someone/tiny-medusa"])
    assert not (tmp_path / "someone").exists()
