"""Experiment configuration: one YAML file -> nested dataclasses, strictly checked.

A typo in a config key must not silently fall back to a default (``lerning_rate: 1e-4`` training
at 1e-3 for a day), so every key at every level is checked against the dataclass fields, every
value against the field's type, and command-line overrides (``train.lr=3e-4``) get the same
checks. Errors name the full dotted key and what is valid there.
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Sequence

import yaml

from .data.config import DataConfig


class ConfigError(ValueError):
    """A bad config file, key, value or override; the message says which and what is valid."""


# ---------------------------------------------------------------------------------------------
# The schema
# ---------------------------------------------------------------------------------------------

DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")


@dataclass
class TargetConfig:
    """The frozen model the heads learn to predict ahead of."""

    name_or_path: str = "demo"  # "demo" = the offline demo target (built on first use), else hub id or folder
    dtype: Literal["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"] = "auto"
    attn_implementation: str | None = "sdpa"
    trust_remote_code: bool = False
    revision: str | None = None


@dataclass
class HeadsSpec:
    """Which draft heads to train (the architecture itself is fixed by the target's sizes)."""

    type: str = "medusa"  # medusa | hydra | eagle | eagle3
    # medusa/hydra: heads (one per future position); eagle/eagle3: draft steps unrolled in training
    # (eagle: 1 = EAGLE-1's teacher-forced recipe; eagle3: training-time test, steps weighted 0.8^k).
    num_heads: int = 4
    num_layers: int = 1  # residual blocks per head (medusa/hydra) or decoder layers (eagle/eagle3)
    lm_head: Literal["auto", "own", "shared"] = "auto"  # medusa/hydra only
    feature_layers: list[int] | None = None  # eagle3: target layers fused (default 2, L/2, L-3)
    draft_vocab_size: int | None = None  # eagle3: size of its own LM head's vocabulary (default 32000)
    noise: float = 0.1  # eagle: amplitude of the uniform noise added to target features in training
    # eagle: a bias on the fc fusing embedding and feature. Off by default: vLLM's EAGLE-1 has no fc
    # bias (it would drop one silently); heads saved before this option had one and still load.
    fc_bias: bool = False
    # A heads folder (draftheads' own, or `draftheads import`ed) to continue training from: loaded
    # strictly; its type and sizes must equal the ones configured here.
    init_from: str | None = None


@dataclass
class TrainConfig:
    output_dir: str = "runs/medusa"
    max_steps: int | None = None  # optimizer steps; None: num_epochs over the training split
    num_epochs: int = 1
    batch_size: int = 8  # sequences per process per micro-step
    grad_accum: int = 1
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0  # None or 0 disables clipping
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    eval_every: int = 500  # steps; 0: only the final evaluation
    eval_batches: int = 50  # batches per evaluation (per process); 0: the whole eval split
    save_every: int = 1000  # steps; 0: no checkpoints
    log_every: int = 10
    seed: int = 0
    loss_decay: float = 0.8  # weight of head k is loss_decay ** k
    loss_chunk_size: int = 1024  # positions per loss chunk (bounds the vocab-sized fp32 logits)
    resume: str | None = None  # a checkpoint folder, "auto" (latest in output_dir), or None
    topk: int = 5
    # What the heads learn to predict: "data" = the dataset's next tokens (Medusa-1), "target" = the
    # target's own greedy prediction at each position (self-distillation: what verification accepts).
    labels: Literal["data", "target"] = "data"
    # Draw each batch from rows of similar length (less padding, the same per-row losses; see
    # draftheads/data/sampling.py). Worth it for chat data with widely spread lengths.
    group_by_length: bool = False


@dataclass
class TrackingConfig:
    report_to: Literal["none", "wandb", "tensorboard"] = "none"
    project: str = "draftheads"
    run_name: str | None = None


@dataclass
class ExperimentConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    heads: HeadsSpec = field(default_factory=HeadsSpec)
    data: DataConfig = field(default_factory=lambda: DataConfig(path="demo"))
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read a YAML experiment file and apply ``key.sub=value`` overrides (values parsed as YAML)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file not found: {path} (pass --config with an existing YAML file, e.g. configs/demo.yaml)"
        )
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path} is not valid YAML: {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    try:
        return config_from_dict(data, overrides)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def config_from_dict(data: dict[str, Any], overrides: Sequence[str] = ()) -> ExperimentConfig:
    data = _deepcopy(data)
    for item in overrides:
        key, value = parse_override(item)
        _apply_override(data, key, value, item)
    cfg = _build(ExperimentConfig, data, "")
    validate(cfg)
    return cfg


def parse_override(item: str) -> tuple[str, Any]:
    """``"train.lr=3e-4"`` -> ``("train.lr", 0.0003)``; the value is a YAML scalar (``null``, ``true``, ...)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value (e.g. train.max_steps=100)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def _apply_override(data: dict[str, Any], key: str, value: Any, item: str) -> None:
    """Check ``key`` against the schema (so a typo names the override) and set it in ``data``."""
    cls: Any = ExperimentConfig
    node = data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[:depth])
        if not _is_dataclass_type(cls):
            raise ConfigError(f"override {item!r}: {prefix!r} is a value, not a section with keys")
        hints = _hints(cls)
        if part not in hints:
            raise ConfigError(f"override {item!r}: {_unknown_key_message(cls, part, prefix)}")
        cls = _strip_optional(hints[part])
        if depth == len(parts) - 1:
            if not _is_dataclass_type(cls):
                try:
                    _coerce(value, hints[part], key)  # fail early, naming the override
                except ConfigError as e:
                    raise ConfigError(f"override {item!r}: {e}") from None
            node[part] = value
        else:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: depth + 1])!r} is not a mapping in the file")
            node = child


# ---------------------------------------------------------------------------------------------
# Checked construction
# ---------------------------------------------------------------------------------------------


def _build(cls: Any, data: Any, prefix: str, defaults: Any = None) -> Any:
    """Build ``cls`` from ``data``; a key missing from ``data`` takes its value from ``defaults`` (the
    parent's default instance, so ``data.max_length=256`` keeps the default ``data.path``) or the field."""
    where = prefix[:-1] if prefix else "the config"
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping of keys, got {type(data).__name__} {data!r}")
    hints = _hints(cls)
    for key in data:
        if not isinstance(key, str) or key not in hints:
            raise ConfigError(_unknown_key_message(cls, str(key), prefix[:-1]))
    kwargs = {}
    for f in dataclasses.fields(cls):
        full = prefix + f.name
        if f.name not in data:
            if defaults is not None:
                kwargs[f.name] = getattr(defaults, f.name)
                continue
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                raise ConfigError(f"{full} is required (no default)")
            continue
        tp = hints[f.name]
        value = data[f.name]
        if _is_dataclass_type(_strip_optional(tp)) and not (value is None and _allows_none(tp)):
            sub_defaults = getattr(defaults, f.name) if defaults is not None else _field_default(f)
            kwargs[f.name] = _build(_strip_optional(tp), value if value is not None else {}, full + ".", sub_defaults)
        else:
            kwargs[f.name] = _coerce(value, tp, full)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(prefix) and prefix else f"{where}: {msg}") from None


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return None


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` if it fits ``tp`` (int -> float widening allowed), else raise naming ``key``."""
    ok, out = _fit(value, tp)
    if not ok:
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return out


def _fit(value: Any, tp: Any) -> tuple[bool, Any]:
    if tp is Any:
        return True, value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return type(None) in typing.get_args(tp), None
        for arg in typing.get_args(tp):
            if arg is type(None):
                continue
            ok, out = _fit(value, arg)
            if ok:
                return True, out
        return False, None
    if origin is Literal:
        return value in typing.get_args(tp), value
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            return False, None
        (arg,) = typing.get_args(tp)[:1] or (Any,)
        out = []
        for v in value:
            ok, o = _fit(v, arg)
            if not ok:
                return False, None
            out.append(o)
        return True, out
    if origin is dict or tp is dict:
        return isinstance(value, dict), value
    if tp is type(None):
        return value is None, None
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if tp is float:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, (int, float)):
            return True, float(value)
        if isinstance(value, str):
            # PyYAML (YAML 1.1) reads `1e-3` (no dot) as a string; accept any float literal.
            try:
                return True, float(value)
            except ValueError:
                return False, None
        return False, None
    if tp is str:
        return isinstance(value, str), value
    if isinstance(tp, type):
        return isinstance(value, tp), value
    return True, value


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _unknown_key_message(cls: Any, key: str, where: str) -> str:
    valid = list(_hints(cls))
    full = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {(where + '.' if where else '') + close[0]!r}?)" if close else ""
    section = f"under {where!r}" if where else "at the top level"
    return f"unknown config key {full!r}{hint}; valid keys {section}: {', '.join(valid)}"


def _hints(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data


# ---------------------------------------------------------------------------------------------
# Semantic checks (ranges, known head types)
# ---------------------------------------------------------------------------------------------


def validate(cfg: ExperimentConfig) -> None:
    from .heads import head_types

    types_ = head_types()
    if cfg.heads.type not in types_:
        raise ConfigError(f"heads.type: unknown head type {cfg.heads.type!r}; valid: {', '.join(sorted(types_))}")
    _validate_heads_spec(cfg.heads, types_)
    t = cfg.train
    checks = [
        ("heads.num_heads", cfg.heads.num_heads >= 1, ">= 1"),
        ("heads.num_layers", cfg.heads.num_layers >= 0, ">= 0"),
        ("train.max_steps", t.max_steps is None or t.max_steps >= 1, ">= 1 or null"),
        ("train.num_epochs", t.num_epochs >= 1, ">= 1"),
        ("train.batch_size", t.batch_size >= 1, ">= 1"),
        ("train.grad_accum", t.grad_accum >= 1, ">= 1"),
        ("train.lr", t.lr > 0, "> 0"),
        ("train.weight_decay", t.weight_decay >= 0, ">= 0"),
        ("train.warmup_steps", t.warmup_steps >= 0, ">= 0"),
        ("train.max_grad_norm", t.max_grad_norm is None or t.max_grad_norm >= 0, ">= 0 or null"),
        ("train.eval_every", t.eval_every >= 0, ">= 0"),
        ("train.eval_batches", t.eval_batches >= 0, ">= 0"),
        ("train.save_every", t.save_every >= 0, ">= 0"),
        ("train.log_every", t.log_every >= 1, ">= 1"),
        ("train.loss_decay", 0 < t.loss_decay <= 1, "in (0, 1]"),
        ("train.loss_chunk_size", t.loss_chunk_size >= 1, ">= 1"),
        ("train.topk", t.topk >= 1, ">= 1"),
    ]
    for key, ok, what in checks:
        if not ok:
            section, name = key.split(".")
            raise ConfigError(f"{key} must be {what}, got {getattr(getattr(cfg, section), name)!r}")


def _validate_heads_spec(spec: HeadsSpec, types_: dict[str, type]) -> None:
    """Options of other head types are an error, not silently ignored: a user who sets
    ``feature_layers`` for Medusa heads expects them to matter, and training for hours on a
    configuration other than the one written down is the failure this module exists to prevent
    (the same reason an unknown key is an error). Only values different from the default count,
    so a shared config keeping ``noise: 0.1`` still works for every type."""
    defaults = HeadsSpec()
    takes = types_[spec.type].spec_options
    for f in dataclasses.fields(HeadsSpec):
        value = getattr(spec, f.name)
        if f.name in ("type", "num_heads", "num_layers", "init_from") or f.name in takes or value == getattr(defaults, f.name):
            continue
        users = sorted(name for name, cls in types_.items() if f.name in cls.spec_options)
        raise ConfigError(
            f"heads.{f.name} is set ({value!r}) but {spec.type} heads do not use it: it applies to "
            f"{', '.join(users)} heads only; remove it or change heads.type"
        )
    if spec.draft_vocab_size is not None and spec.draft_vocab_size < 1:
        raise ConfigError(
            f"heads.draft_vocab_size must be >= 1 or null (null: 32000, capped at the target's vocabulary), "
            f"got {spec.draft_vocab_size}"
        )
    if spec.feature_layers is not None and (not spec.feature_layers or min(spec.feature_layers) < 0):
        raise ConfigError(
            f"heads.feature_layers must be a non-empty list of target layer ids >= 0 (i = the hidden state entering "
            f"layer i; null = default), got {spec.feature_layers!r}; the upper bound, the target's layer count, is "
            "checked when the target is loaded"
        )
    if spec.noise < 0:
        raise ConfigError(f"heads.noise must be >= 0, got {spec.noise!r}")
