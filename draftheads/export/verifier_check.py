"""Whether the target an import is given is the verifier the checkpoint says it drafts for.

An import stamps the heads with the given target's LM-head fingerprint, after which nothing tells
them from heads trained for it. Heads of another model with the same shapes would then load and
decode (losslessly, since the verifier decides) with little acceptance, and no error anywhere.
So a checkpoint that names its verifier (the speculators config's ``verifier.name_or_path``, a
`draftheads export`'s record, a Medusa config's ``base_model_name_or_path``) is imported only
for that verifier, or one shown to be the same model (a local copy: the same LM head), unless the
user says otherwise.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from ..heads.config import fingerprints_match, weight_fingerprint
from .common import EXPORT_METADATA
from .sources import Source

ALLOW_FLAG = "--allow-other-verifier"


def recorded_verifier(source: Source) -> tuple[str, str] | None:
    """(the verifier ``source`` names, the file that names it), or None when it names none."""
    cfg = source.config
    spec = cfg.get("speculators_config")
    verifier = spec.get("verifier") if isinstance(spec, dict) else None
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    if isinstance(name, str) and name:
        return name, str(source.path / "config.json") if source.path.is_dir() else source.describe()
    record = source.path / EXPORT_METADATA
    if source.path.is_dir() and record.is_file():
        try:
            made = json.loads(record.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            made = {}
        if isinstance(made, dict) and isinstance(made.get("verifier"), str) and made["verifier"]:
            return made["verifier"], str(record)
    base = cfg.get("base_model_name_or_path")
    if isinstance(base, str) and base:
        return base, str(source.path / "config.json") if source.path.is_dir() else source.describe()
    return None


def _lm_head(folder: Path) -> torch.Tensor | None:
    """A model folder's LM head weight (its embedding when tied), read from its safetensors."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    text = cfg.get("text_config") or cfg
    tied = bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    wanted = ("lm_head.weight",) if not tied else ("lm_head.weight", "model.embed_tokens.weight", "embed_tokens.weight")
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in wanted:
                    if name in f.keys():
                        return f.get_tensor(name)
        except Exception:  # noqa: BLE001 (an unreadable file: no verdict from it)
            continue
    return None


def _hub_name_matches(hub_id: str, path: str) -> bool:
    """A local folder named like the Hub repo (``.../Llama-3.1-8B``, or the Hub cache's
    ``models--org--Llama-3.1-8B``) for ``org/Llama-3.1-8B``."""
    parts = Path(path).absolute().parts
    repo = hub_id.rstrip("/").split("/")[-1].lower()
    return bool(parts) and (parts[-1].lower() == repo or f"models--{hub_id.replace('/', '--')}".lower()
                            in (p.lower() for p in parts))


def same_model(recorded: str, target_name: str, target: torch.nn.Module) -> bool:
    """Whether the target called ``target_name`` (loaded as ``target``) is the ``recorded`` verifier."""
    from ..target import named_target

    if recorded == target_name or named_target(recorded) is not None and named_target(recorded) == named_target(target_name):
        return True
    folder = Path(recorded).expanduser()
    if folder.is_dir():
        if Path(target_name).expanduser().is_dir() and folder.resolve() == Path(target_name).expanduser().resolve():
            return True
        weight = _lm_head(folder)
        if weight is not None:
            mine = target.get_output_embeddings().weight
            return tuple(weight.shape) == tuple(mine.shape) and fingerprints_match(
                weight_fingerprint(weight), weight_fingerprint(mine.detach()))
        return False
    return "/" in recorded and not recorded.startswith((".", "/", "~")) and _hub_name_matches(recorded, target_name)


def check_recorded_verifier(source: Source, target: torch.nn.Module, target_name: str | None, allow: bool) -> None:
    """Refuse to import ``source`` for ``target`` when it names another verifier (see the module
    doc). ``target_name``: what the user called the target (None: the model's ``name_or_path``;
    without either, nothing is checked). ``allow``: the user vouches that it is that model."""
    found = recorded_verifier(source)
    name = target_name or getattr(target, "name_or_path", "") or ""
    if allow or found is None or not name:
        return
    recorded, where = found
    if same_model(recorded, name, target):
        return
    shown = Path(recorded).expanduser()
    detail = " (another LM head: another model)" if shown.is_dir() else ""
    raise ValueError(
        f"{where} names its verifier {recorded}, but the target is {name}{detail}: the imported heads would be "
        f"stamped as {name}'s and draft for a model they were not trained for. Import with the target the checkpoint "
        f"names, or pass {ALLOW_FLAG} if {name} is that model (a copy, a re-upload)"
    )
