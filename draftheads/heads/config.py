"""Configuration of a set of draft heads, and the identity of the target they were trained for.

The config travels inside every exported heads folder (``config.json``). It records enough of the
target to refuse, at load time, heads that were trained for a different model: a head trained on
one model's hidden states is noise on another's, and nothing else would tell the user.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

FORMAT_VERSION = 1


def text_config(model_or_config: Any) -> Any:
    """The text part of a config (multimodal models nest it); a plain LM config is returned as is."""
    config = getattr(model_or_config, "config", model_or_config)
    getter = getattr(config, "get_text_config", None)
    return getter() if getter is not None else config


def target_decoder(target: Any) -> Any:
    """The decoder stack of an HF causal LM (``model.model`` for Llama/Qwen2), or None for a model
    without a plain one (``get_decoder`` missing or failing)."""
    get_decoder = getattr(target, "get_decoder", None)
    try:
        return get_decoder() if get_decoder is not None else None
    except Exception:  # noqa: BLE001 - any model without a plain decoder
        return None


def target_final_norm(target: Any) -> Any:
    """The final norm of an HF causal LM's decoder (``norm``, or GPT-2's ``ln_f``), or None."""
    decoder = target_decoder(target)
    for name in ("norm", "final_layernorm", "ln_f"):
        module = getattr(decoder, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    return None


@dataclass
class TargetInfo:
    """What a set of heads knows about its target; compared field by field at load time."""

    model_type: str
    architecture: str
    hidden_size: int
    vocab_size: int
    num_hidden_layers: int
    name_or_path: str = ""
    # Statistics of the target's LM head weight: catches another model with identical sizes
    # (e.g. a different fine-tune of the same base). Compared with a tolerance so that the same
    # target loaded in bf16 or fp32 still matches.
    lm_head_fingerprint: list[float] = field(default_factory=list)

    @classmethod
    def from_model(cls, model: torch.nn.Module) -> "TargetInfo":
        cfg = text_config(model)
        archs = getattr(model.config, "architectures", None) or [type(model).__name__]
        lm_head = model.get_output_embeddings()
        return cls(
            model_type=str(getattr(cfg, "model_type", "")),
            architecture=str(archs[0]),
            hidden_size=int(cfg.hidden_size),
            vocab_size=int(lm_head.weight.shape[0]),
            num_hidden_layers=int(cfg.num_hidden_layers),
            name_or_path=str(getattr(model.config, "_name_or_path", "") or ""),
            lm_head_fingerprint=weight_fingerprint(lm_head.weight),
        )

    def mismatches(self, other: "TargetInfo") -> list[str]:
        """Human-readable differences that make heads unusable on ``other``; empty if compatible."""
        problems = []
        for name in ("hidden_size", "vocab_size", "num_hidden_layers", "model_type"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                problems.append(f"{name}: heads were trained for {mine!r}, target has {theirs!r}")
        if not problems and self.lm_head_fingerprint and other.lm_head_fingerprint:
            if not fingerprints_match(self.lm_head_fingerprint, other.lm_head_fingerprint):
                problems.append(
                    "the target's LM head weights differ from the ones the heads were trained with "
                    "(same sizes, different model or fine-tune)"
                )
        return problems


def weight_fingerprint(weight: torch.Tensor, rows: int = 64) -> list[float]:
    """A few order statistics of the first rows of a weight matrix, robust to bf16 rounding."""
    if weight.is_meta:  # sizing heads for a model that was never loaded (no weights to compare)
        return []
    with torch.no_grad():
        w = weight[:rows].detach().float().cpu()
        return [float(w.mean()), float(w.std()), float(w.abs().mean()), float(w[:, : w.shape[1] // 2].sum())]


def fingerprints_match(a: list[float], b: list[float], rtol: float = 2e-2, atol: float = 1e-4) -> bool:
    if len(a) != len(b):
        return False
    return all(abs(x - y) <= atol + rtol * max(abs(x), abs(y)) for x, y in zip(a, b))


@dataclass
class HeadsConfig:
    """Architecture of a set of draft heads. Serialised as ``config.json`` in a heads folder."""

    head_type: str
    num_heads: int
    num_layers: int
    hidden_size: int
    vocab_size: int
    # "own": each head has a trainable vocab projection initialised from the target's LM head.
    # "shared": heads reuse the target's frozen LM head (nothing vocab-sized is stored).
    lm_head: str = "own"
    target: TargetInfo | None = None
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.target, dict):
            self.target = TargetInfo(**self.target)
        if self.lm_head not in ("own", "shared"):
            raise ValueError(f"lm_head must be 'own' or 'shared', got {self.lm_head!r}")
        if self.num_heads < 1 or self.num_layers < 0:
            raise ValueError(f"need num_heads >= 1 and num_layers >= 0, got {self.num_heads}, {self.num_layers}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HeadsConfig":
        """Build from parsed JSON, refusing (with the key named) anything missing, unknown or of
        the wrong type instead of failing later with a bare TypeError/KeyError."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object of heads settings, got a JSON {_json_kind(data)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown field(s) in heads config.json: {', '.join(unknown)}")
        _check_keys(data, _CONFIG_KEYS, "")
        target = data.get("target")
        if target is not None:
            if not isinstance(target, dict):
                raise ValueError(f"key 'target' must be an object describing the target model, got a JSON {_json_kind(target)}")
            unknown = sorted(set(target) - {f.name for f in dataclasses.fields(TargetInfo)})
            if unknown:
                raise ValueError(f"unknown key(s) in 'target': {', '.join(unknown)}")
            _check_keys(target, _TARGET_KEYS, "target.")
        return cls(**data)

    def digest(self) -> str:
        return hashlib.sha1(repr(sorted(self.to_dict().items())).encode()).hexdigest()[:10]


# (type, required) of each key of config.json and of its "target" object.
_CONFIG_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "head_type": (str, True),
    "num_heads": (int, True),
    "num_layers": (int, True),
    "hidden_size": (int, True),
    "vocab_size": (int, True),
    "lm_head": (str, False),
    "format_version": (int, False),
    "extra": (dict, False),
}
_TARGET_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "model_type": (str, True),
    "architecture": (str, True),
    "hidden_size": (int, True),
    "vocab_size": (int, True),
    "num_hidden_layers": (int, True),
    "name_or_path": (str, False),
    "lm_head_fingerprint": (list, False),
}


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "list", str: "string", bool: "boolean", int: "integer", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _check_keys(data: dict, spec: dict, prefix: str) -> None:
    missing = [f"{prefix}{k}" for k, (_, required) in spec.items() if required and k not in data]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    for key, (kind, _) in spec.items():
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            want = _json_kind(kind())
            raise ValueError(f"key {prefix}{key} must be a JSON {want}, got {_json_kind(value)} {value!r}")
        if kind is int and key in ("num_heads", "hidden_size", "vocab_size", "num_hidden_layers") and value < 1:
            raise ValueError(f"key {prefix}{key} must be >= 1, got {value}")
