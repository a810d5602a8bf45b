"""Reading a checkpoint someone else wrote: its config.json and its tensors, without pickle where possible.

safetensors files are read directly; ``.bin``/``.pt`` files (older Medusa and EAGLE releases) only
through ``torch.load(weights_only=True)``, which refuses anything but tensors and plain containers.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

SAFETENSORS_NAMES = ("model.safetensors", "model-*.safetensors")
PICKLE_NAMES = ("pytorch_model.bin", "pytorch_model-*.bin")


@dataclass
class Source:
    path: Path
    config: dict
    tensors: dict[str, torch.Tensor]
    files: list[Path] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(str(f) for f in self.files) or str(self.path)


def _patterns(named: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(safetensors patterns, pickle patterns) in the order tried: the usual names, the ones import
    layouts declare (``named``), then any file of the kind."""
    return ((*SAFETENSORS_NAMES, *(n for n in named if n.endswith(".safetensors")), "*.safetensors"),
            (*PICKLE_NAMES, *(n for n in named if not n.endswith(".safetensors")), "*.pt", "*.bin"))


def weight_files(path: Path, named: tuple[str, ...] = ()) -> list[Path]:
    """The checkpoint's weight files: safetensors if there are any, else pickles."""
    if path.is_file():
        return [path]
    for patterns in _patterns(named):
        for pattern in patterns:
            found = sorted(p for p in path.glob(pattern) if p.is_file())
            if found:
                return found
    return []


def _kept(keys: list[str], keep_only: tuple[str, ...]) -> list[str]:
    """The keys a reader keeps: those under ``keep_only`` when any is, else all."""
    kept = [k for k in keys if k.startswith(keep_only)] if keep_only else []
    return kept or keys


def _read_safetensors(file: Path, keep_only: tuple[str, ...]) -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(file), framework="pt") as f:
            keys = _kept(list(f.keys()), keep_only)
            return {k: f.get_tensor(k) for k in keys}
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{file} is not a readable safetensors file (truncated or corrupt?): {e}") from None


def _read_pickle(file: Path, keep_only: tuple[str, ...]) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as e:  # weights_only refuses arbitrary objects: say so instead of unpickling them
        raise ValueError(f"{file} could not be read with torch.load(weights_only=True) ({type(e).__name__}: {e}); "
                         "convert it to safetensors first") from None
    if isinstance(data, dict) and "state_dict" in data and isinstance(data["state_dict"], dict):
        data = data["state_dict"]
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise ValueError(f"{file} does not hold a flat name -> tensor dictionary")
    return {k: data[k] for k in _kept(list(data), keep_only)}


def read_source(src: str | Path, weight_names: tuple[str, ...] = (), keep_only: tuple[str, ...] = ()) -> Source:
    """``src``'s config.json and tensors. ``weight_names``: further weight-file names to look for;
    ``keep_only``: tensor-name prefixes that, when a file holds any, are all of it read (what the
    import layouts declare: `registry.ImportLayout`)."""
    path = Path(src)
    if not path.exists():
        raise FileNotFoundError(f"import source not found: {path}")
    files = weight_files(path, weight_names)
    if not files:
        raise FileNotFoundError(f"no weights in {path}: looked for {', '.join(sum(_patterns(weight_names), ()))}")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        part = _read_safetensors(file, keep_only) if file.suffix == ".safetensors" else _read_pickle(file, keep_only)
        tensors.update(part)
    config_file = (path if path.is_dir() else path.parent) / "config.json"
    config = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{config_file} is not valid JSON ({e})") from None
    return Source(path, config, tensors, files)


def load_strict(heads: torch.nn.Module, state: dict[str, torch.Tensor], where: str) -> torch.nn.Module:
    """Like `load_heads`: every tensor present and of the shape the target implies, else an error
    naming it. Floats are cast to the heads' dtype (fp32)."""
    expected = heads.state_dict()
    missing = sorted(set(expected) - set(state))
    wrong = sorted(k for k in set(expected) & set(state) if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or wrong:
        d = heads.config
        raise ValueError(
            f"{where} does not fit the target (hidden {d.hidden_size}, vocab {d.vocab_size}): "
            + "; ".join(
                ([f"missing {', '.join(missing[:6])}"] if missing else [])
                + [f"{k}: {tuple(state[k].shape)} where the target needs {tuple(expected[k].shape)}" for k in wrong[:6]]
            )
        )
    cast = {k: (v.to(expected[k].dtype) if v.is_floating_point() else v.to(expected[k].dtype)) for k, v in state.items()}
    heads.load_state_dict(cast, strict=True)
    return heads
