"""Experiment configuration: one YAML file -> nested dataclasses, strictly checked.

A typo in a config key must not silently fall back to a default (``lerning_rate: 1e-4`` training
at 1e-3 for a day), so every key at every level is checked against the dataclass fields and every
value against the field's type; command-line overrides (``train.lr=3e-4``) get the same checks.
pydantic (v2) does the checking (``extra="forbid"``, strict scalar types); this module only turns
its errors into messages that name the full dotted key and what is valid there.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import yaml
from annotated_types import Ge, Gt, Le
from pydantic import TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass

from . import smollm2
from .data.config import DataConfig
from .registry import default_head_type
from .schema import CHECKED, Bool, Float, Int, NonNegative, Positive, Str, TargetLoss


class ConfigError(ValueError):
    """A bad config file, key, value or override; the message says which and what is valid."""


# ---------------------------------------------------------------------------------------------
# The schema
# ---------------------------------------------------------------------------------------------


@dataclass(config=CHECKED)
class TargetConfig:
    """The frozen model the heads learn to predict ahead of."""

    name_or_path: Str = "smollm2"  # "smollm2" = the real small model installed from PyPI, else hub id or folder
    dtype: Literal["auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"] = "auto"
    attn_implementation: Str | None = "sdpa"
    trust_remote_code: Bool = False
    revision: Str | None = None

    def __post_init__(self) -> None:
        if self.name_or_path == smollm2.RETIRED_TARGET and not Path(self.name_or_path).exists():
            raise ValueError(smollm2.retired_message("target.name_or_path", self.name_or_path))


@dataclass(config=CHECKED)
class HeadsSpec:
    """Which draft heads to train (the architecture itself is fixed by the target's sizes)."""

    # medusa | hydra | eagle | eagle3 | peagle | dflash | dspark | dflash2 | ...; the same name as HeadsConfig.head_type in a heads folder's
    # config.json. Files written before the rename say ``type``: read as this (see _upgrade). Unset:
    # the method the registry declares the default (`registry.default_head_type`).
    head_type: Str = field(default_factory=default_head_type)
    # medusa/hydra: heads (one per future position); eagle/eagle3: draft steps unrolled in training
    # (eagle: 1 = EAGLE-1's teacher-forced recipe; eagle3: training-time test, step k weighted train.loss_decay^k);
    # peagle: the depths trained (the most tokens one draft forward may propose).
    num_heads: Positive = 4
    num_layers: NonNegative = 1  # residual blocks per head (medusa/hydra) or decoder layers (eagle/eagle3)
    lm_head: Literal["auto", "own", "shared"] = "auto"  # medusa/hydra only
    feature_layers: list[Int] | None = None  # eagle3: target layers fused (default 2, L/2, L-3)
    draft_vocab_size: Positive | None = None  # eagle3: size of its own LM head's vocabulary (default 32000)
    noise: Annotated[Float, Ge(0)] = 0.1  # eagle: amplitude of the uniform noise added to target features in training
    # eagle: a bias on the fc fusing embedding and feature. Off by default: vLLM's EAGLE-1 has no fc
    # bias (it would drop one silently); heads saved before this option had one and still load.
    fc_bias: Bool = False
    # eagle3 (EAGLE 3.1, as vLLM computes these config keys; methods/eagle3/heads.py): fc_norm = an RMSNorm on each
    # fused target layer's features before fc; norm_output = each draft step hands on its final norm's
    # output (to the LM head and the next step) instead of the pre-norm state. Off: plain EAGLE-3.
    fc_norm: Bool = False
    norm_output: Bool = False
    # eagle3, peagle (vLLM's config key of the same name; methods/eagle3/heads.py): one RMSNorm over the whole fused
    # target input before fc (and before fc_norm); peagle's mask_hidden goes through it too, as in vLLM
    # (methods/peagle/heads.py). On in the speculators trainer's defaults. Off: as before.
    norm_before_fc: Bool = False
    # peagle, dflash: the placeholder token of the mask slots, an id the tokenizer never produces from
    # text. None: peagle takes the tokenizer's mask token, else an unused embedding row past the
    # tokenizer's vocabulary, else a distinct pad token; dflash the first embedding row past the
    # tokenizer's tokens, else its mask token (refused when it has neither). An id the training data
    # holds is refused.
    mask_token_id: NonNegative | None = None
    # peagle (COD sampling): depth d trains on max(cod_ratio^d, cod_min_ratio) of the positions
    cod_ratio: Annotated[Float, Gt(0), Le(1)] = 0.7
    cod_min_ratio: Annotated[Float, Gt(0), Le(1)] = 0.2
    # dflash: the block is [last accepted token, mask x (block_size - 1)], all drafted in one forward
    # (unset: num_heads + 1; when set, num_heads is block_size - 1 and not read). feature_layers: the
    # target layers whose features form the context (default: 5 spread ones, z-lab's choice).
    block_size: Annotated[Int, Ge(2)] | None = None
    loss_gamma: Annotated[Float, Gt(0)] | None = None  # dflash: slot k weighs exp(-(k-1)/gamma) (default 7)
    # eagle, eagle3, peagle, dflash: how each draft step / depth / slot is scored against the target
    # (train/target_loss.py): "soft_ce" its distribution (the papers'), "kl" the same objective
    # reported as KL(target || draft), "ce" its greedy token (hard labels), "lk" LK's negative log
    # acceptance rate. Replaces dflash's `block_loss` (whose "kl" was computed as soft CE).
    loss: TargetLoss = "soft_ce"
    num_anchors: Positive | None = None  # dflash: blocks drawn per training row (default 32)
    # dflash, peagle: train draft depth d only where the data's d-1 tokens before it are the target's
    # own greedy tokens (what verification requires before it accepts depth d); off: every depth
    # everywhere, the published recipe on target-generated data.
    greedy_path: Bool = False
    # dspark (methods/dspark/heads.py): the Markov head's rank r (its V x r and r x V factors; default 256,
    # 1..vocabulary); the confidence head (each draft's acceptance estimate, which the draft budget reads),
    # fed the Markov embedding of the previous token too (confidence_with_markov), trained with weight
    # confidence_alpha (default 1.0); sample_from_anchor: the root's slot drafts the first token, so a block
    # of block_size slots drafts block_size tokens (vLLM's default for Qwen3DSparkModel; off: block_size - 1).
    markov_rank: Int | None = None
    confidence_head: Bool = True
    confidence_with_markov: Bool = True
    confidence_alpha: Annotated[Float, Ge(0)] | None = None
    sample_from_anchor: Bool = True
    # dflash2 (methods/dflash2/heads.py): the grouped dynamic convolution's taps (default 2, at most the
    # block) and channels per group (default 16, dividing the hidden size); the candidate selector's
    # rank (default 256) and candidates per slot (default 16), its loss weight selector_alpha (default 1.0).
    conv_kernel_size: Int | None = None
    conv_group_size: Int | None = None
    selector_rank: Int | None = None
    selector_top_k: Int | None = None
    selector_alpha: Annotated[Float, Ge(0)] | None = None
    # A heads folder (draftheads' own, or `draftheads import`ed) to continue training from: loaded
    # strictly; its type and sizes must equal the ones configured here.
    init_from: Str | None = None
    # How fresh heads start, for every head type (draftheads/heads/init.py): "identity" = each
    # type's own (blocks start as the identity: zero output projections), "torch" = PyTorch's
    # default init of every linear (the EAGLE-3 authors' trainer). Not used with init_from.
    init: Literal["identity", "torch"] = "identity"
    # eagle3, peagle: how their own draft-vocabulary LM head starts. "random": drawn as `init` says (the
    # EAGLE-3 authors' trainer); "target": the target's LM head rows of the draft vocabulary, and the
    # draft's final norm the target's, so a fresh head scores a state as the target would (measured on
    # the earlier toy target: "Training recipe" in `git show 19f3628:benchmarks/README.md`). Not used with init_from.
    lm_head_init: Literal["random", "target"] = "random"


@dataclass(config=CHECKED)
class TrainConfig:
    output_dir: Str = "runs/draftheads"
    max_steps: Positive | None = None  # optimizer steps; None: num_epochs over the training split
    num_epochs: Positive = 1
    batch_size: Positive = 8  # sequences per process per micro-step
    grad_accum: Positive = 1
    lr: Annotated[Float, Gt(0)] = 1e-3
    weight_decay: Annotated[Float, Ge(0)] = 0.0
    warmup_steps: NonNegative = 0
    # After the warmup: "cosine" to zero, "linear" to zero, or "constant" (train/optim.py).
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    adam_betas: list[Float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW's (beta1, beta2)
    max_grad_norm: Annotated[Float, Ge(0)] | None = 1.0  # None or 0 disables clipping
    mixed_precision: Literal["auto", "no", "bf16", "fp16"] = "auto"
    eval_every: NonNegative = 500  # steps; 0: only the final evaluation
    eval_batches: NonNegative = 50  # batches per evaluation (per process); 0: the whole eval split
    save_every: NonNegative = 1000  # steps; 0: no checkpoints
    log_every: Positive = 10
    seed: Int = 0
    loss_decay: Annotated[Float, Gt(0), Le(1)] = 0.8  # weight of head k is loss_decay ** k
    loss_chunk_size: Positive = 1024  # positions per loss chunk (bounds the vocab-sized fp32 logits)
    # Recompute each loss chunk's vocab-sized logits in backward instead of keeping them (memory:
    # otherwise ~ rows x vocab x 12 bytes per unrolled step). false: the same gradients bit for bit,
    # fewer operations (toy-target steps: EAGLE 1.22-1.37x faster, EAGLE-3 1.05x); for small vocabularies or big memory.
    loss_checkpointing: Bool = True
    resume: Str | None = None  # a checkpoint folder, "auto" (latest in output_dir), or None
    topk: Positive = 5
    # What the heads learn to predict: "data" = the dataset's next tokens (Medusa-1), "target" = the
    # target's own greedy prediction at each position (self-distillation: what verification accepts).
    labels: Literal["data", "target"] = "data"
    # Draw each batch from rows of similar length (less padding, the same per-row losses; see
    # draftheads/data/sampling.py). Worth it for chat data with widely spread lengths.
    group_by_length: Bool = False
    # At the end of training, choose the heads' tree per temperature by timing decoding on this
    # machine and write heads/tree.json. false: skip it (the decoder uses its device default; run
    # `draftheads calibrate` on the machine that will serve, whose timings are the ones that count).
    choose_tree: Bool = True
    # With choose_tree: also time each chosen tree behind prompt lookup (a row whose text repeats an
    # earlier n-gram drafts the copy, the heads the others) and save it in tree.json where it is
    # faster; the decoder follows (SpeculativeDecoder's prompt_lookup=None). false: heads alone.
    choose_prompt_lookup: Bool = True
    # With choose_tree: the prompts the plan is timed on. "auto": the package's "user" set (prompts
    # shaped like users' requests, never the evaluation questions) for a target with a chat template,
    # "text" (raw-text beginnings) for a base model; or a named set or your own file (text: one prompt
    # a line; .jsonl: turns/prompt/text rows), checked before training starts: an empty, binary or
    # evaluation-overlapping file is refused by name (draftheads/data/plan_prompts.py).
    plan_prompts: Str = "auto"

    def __post_init__(self) -> None:
        betas = self.adam_betas
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(
                f"train.adam_betas must be two numbers in [0, 1), [beta1, beta2] (e.g. [0.9, 0.95]), got {betas!r}"
            )


@dataclass(config=CHECKED)
class TrackingConfig:
    report_to: Literal["none", "wandb", "tensorboard"] = "none"
    project: Str = "draftheads"
    run_name: Str | None = None


@dataclass(config=CHECKED)
class ExperimentConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    heads: HeadsSpec = field(default_factory=HeadsSpec)
    data: DataConfig = field(default_factory=DataConfig)  # data.path has no default: training names its data
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_EXPERIMENT = TypeAdapter(ExperimentConfig)

# ---------------------------------------------------------------------------------------------
# YAML without the YAML 1.1 traps
# ---------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 scalars: only true/false are booleans (``no``, ``on``,
    ``off``, ``yes`` stay strings, so ``tracking.run_name=no`` is the name "no"), ``1e-3`` is a
    float (YAML 1.1 wants ``1.0e-3``), and ``1:30`` or ``010`` are not base-60 or octal numbers."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag.rsplit(":", 1)[-1] not in ("bool", "int", "float")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?(?:0|[1-9][0-9_]*)|0x[0-9a-fA-F_]+)$"), list("-+0123456789"))
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def parse_yaml(text: str) -> Any:
    """Parse YAML text with the YAML 1.2 scalar rules above (files and override values alike)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Read a YAML experiment file and apply ``key.sub=value`` overrides (values parsed as YAML)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"config file not found: {path} (pass --config with an existing YAML file, e.g. configs/smollm2.yaml)"
        )
    try:
        data = parse_yaml(path.read_text())
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
    """Check ``data`` (parsed YAML, or a run folder's saved config) with ``overrides`` applied.
    A key missing from ``data`` keeps its default (``data.max_length=256`` keeps ``data.path``)."""
    data = _merge(ExperimentConfig().to_dict(), upgrade_config_dict(data))
    sources: dict[str, str] = {}
    for item in overrides:
        key, value = parse_override(item)
        value = _OLD_VALUES.get(key, {}).get(value, value) if isinstance(value, str) else value
        key = _OLD_KEYS.get(key, key)
        _apply_override(data, key, value, item)
        sources[key] = item
    try:
        cfg = _EXPERIMENT.validate_python(data)
    except ValidationError as e:
        raise ConfigError("; ".join(_explain(err, sources) for err in e.errors())) from None
    validate(cfg)
    return cfg


# Keys renamed since files were written with them: old dotted key -> new one.
_OLD_KEYS = {"heads.type": "heads.head_type", "heads.block_loss": "heads.loss"}
# Values of renamed keys that mean something else under the new name: what the code computed then.
# DFlash's `block_loss: kl` was soft CE (the same gradient as KL, another reported value).
_OLD_VALUES = {"heads.block_loss": {"kl": "soft_ce"}}

# Keys added since run folders were first written, with the value every run before them used
# (what the code did then). A checkpoint's saved config that lacks one was trained with that value,
# whatever today's default is.
ADDED_KEYS: dict[str, Any] = {
    "heads.init": "identity",
    "train.lr_schedule": "cosine",
    "train.adam_betas": [0.9, 0.999],
    # the parallel drafters' options (runs before them had none of these heads)
    "heads.mask_token_id": None,
    "heads.cod_ratio": 0.7,
    "heads.cod_min_ratio": 0.2,
    "heads.block_size": None,
    "heads.loss_gamma": None,
    "heads.loss": "soft_ce",
    "heads.num_anchors": None,
    "heads.greedy_path": False,
    # DSpark's and DFlash2's options (runs before them had neither head type)
    "heads.markov_rank": None,
    "heads.confidence_head": True,
    "heads.confidence_with_markov": True,
    "heads.confidence_alpha": None,
    "heads.sample_from_anchor": True,
    "heads.conv_kernel_size": None,
    "heads.conv_group_size": None,
    "heads.selector_rank": None,
    "heads.selector_top_k": None,
    "heads.selector_alpha": None,
    # EAGLE 3.1 / speculators' norms, and where EAGLE-3's own LM head starts
    "heads.fc_norm": False,
    "heads.norm_output": False,
    "heads.norm_before_fc": False,
    "heads.lm_head_init": "random",
    "train.loss_checkpointing": True,
}


def with_added_keys(saved: Any) -> Any:
    """A copy of a saved (checkpoint or run folder) config dict with the keys in `ADDED_KEYS` it
    lacks set to the value runs used before the key existed, so that comparing it with a config
    of today (resume) sees what that run actually did."""
    if not isinstance(saved, dict):
        return saved
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in saved.items()}
    for dotted, value in ADDED_KEYS.items():
        section, key = dotted.split(".")
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section][key] = value
    return out


def upgrade_config_dict(data: Any) -> Any:
    """A copy of a config dict with renamed keys under their current names (``heads.type`` ->
    ``heads.head_type``), so that older YAML files and run folders' config.json still read."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, new in _OLD_KEYS.items():
        (section, old_key), (_, new_key) = old.split("."), new.split(".")
        if isinstance(data.get(section), dict) and old_key in data[section]:
            if new_key in data[section]:
                raise ConfigError(f"{old} is the old name of {new}: give only {new}")
            renamed = _OLD_VALUES.get(old, {})
            data[section] = {
                (new_key if k == old_key else k): (renamed.get(v, v) if k == old_key and isinstance(v, str) else v)
                for k, v in data[section].items()
            }
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """``"train.lr=3e-4"`` -> ``("train.lr", 0.0003)``; the value is a YAML scalar (``null``, ``true``, ...)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.sub=value (e.g. train.max_steps=100)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = parse_yaml(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def _apply_override(data: dict[str, Any], key: str, value: Any, item: str) -> None:
    """Set ``key`` in ``data`` (which holds every default, so an existing non-mapping on the way
    means the key goes inside a value); unknown keys are left for the schema check to name."""
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[: depth + 1])!r} is a value, not a section with keys")
        node = child
    node[parts[-1]] = value


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``, recursively where both hold a mapping."""
    out = dict(base)
    for key, value in top.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) and isinstance(base.get(key), dict) else value
    return out


# ---------------------------------------------------------------------------------------------
# pydantic's errors in the project's words
# ---------------------------------------------------------------------------------------------

_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le")}


def _explain(err: Any, sources: dict[str, str]) -> str:
    """One validation error as ``<dotted key>: <problem>``, prefixed by the override that set it."""
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    cls, tp, fields = _walk(loc)
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    kind, value = err["type"], err.get("input")
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        message = _unknown_key_message(fields, loc[-1], ".".join(loc[:-1]))
    elif kind == "missing":
        message = f"{key} is required (no default)"
    elif kind in _BOUNDS:
        op, name = _BOUNDS[kind]
        message = f"{key} must be {op} {err['ctx'][name]}{' or null' if _allows_none(tp) else ''}, got {value!r}"
    elif kind == "finite_number":
        message = f"{key} must be a finite number, got {value!r}"
    elif kind in ("dataclass_type", "dataclass_args_type"):
        message = f"{key or 'the config'} must be a mapping of keys, got {type(value).__name__} {value!r}"
    elif kind == "value_error":  # a dataclass's own __post_init__ check: its message names the key
        message = str(err["ctx"]["error"])
    else:
        message = f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}"
    origin = next((item for k, item in sources.items() if key == k or key.startswith(k + ".")), None)
    return f"override {origin!r}: {message}" if origin else message


def _walk(loc: list[str | int]) -> tuple[Any, Any, list[str]]:
    """Follow ``loc`` through the schema: (innermost dataclass, type at loc, that class's fields)."""
    cls: Any = ExperimentConfig
    tp: Any = ExperimentConfig
    for part in loc:
        if isinstance(part, int):  # an item of a list field
            tp = typing.get_args(_strip_optional(tp))[0]
            continue
        hints = typing.get_type_hints(cls) if tp is cls else {}  # a key inside a value: stop there
        if part not in hints:
            break
        tp = hints[part]
        if dataclasses.is_dataclass(_strip_optional(tp)):
            cls = tp = _strip_optional(tp)
    return cls, tp, [f.name for f in dataclasses.fields(cls)]


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    if tp is bool:
        return "bool (true or false)"
    return getattr(tp, "__name__", str(tp))


def _unknown_key_message(valid: list[str], key: str, where: str) -> str:
    full = f"{where}.{key}" if where else key
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" (did you mean {(where + '.' if where else '') + close[0]!r}?)" if close else ""
    section = f"under {where!r}" if where else "at the top level"
    return f"unknown config key {full!r}{hint}; valid keys {section}: {', '.join(valid)}"


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _allows_none(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)


# ---------------------------------------------------------------------------------------------
# Checks that need the head-type registry
# ---------------------------------------------------------------------------------------------


def validate(cfg: ExperimentConfig) -> None:
    """Options of other head types are an error, not silently ignored: a user who sets
    ``feature_layers`` for Medusa heads expects them to matter, and training for hours on a
    configuration other than the one written down is the failure this module exists to prevent
    (the same reason an unknown key is an error). Only values different from the default count,
    so a shared config keeping ``noise: 0.1`` still works for every type."""
    from .registry import UnknownMethodError, method_named, methods

    spec = cfg.heads
    try:
        method = method_named(spec.head_type)
    except UnknownMethodError:
        valid = ", ".join(sorted(m.name for m in methods()))
        raise ConfigError(f"heads.head_type: unknown head type {spec.head_type!r}; valid: {valid}") from None
    defaults = HeadsSpec()
    for f in dataclasses.fields(HeadsSpec):
        value = getattr(spec, f.name)
        if (f.name in ("head_type", "num_heads", "num_layers", "init_from", "init")
                or f.name in method.options or value == getattr(defaults, f.name)):
            continue
        users = sorted(m.name for m in methods() if f.name in m.options)
        raise ConfigError(
            f"heads.{f.name} is set ({value!r}) but {spec.head_type} heads do not use it: it applies to "
            f"{', '.join(users)} heads only; remove it or change heads.head_type"
        )
    for name in ("init", "lm_head_init"):
        if spec.init_from is not None and getattr(spec, name) != getattr(defaults, name):
            raise ConfigError(
                f"heads.{name}={getattr(spec, name)!r} has no effect with heads.init_from ({spec.init_from}): the heads "
                "start from that folder's weights; remove one of the two"
            )
    if cfg.train.labels != TrainConfig().labels and not method.learns_next_tokens:
        users = sorted(m.name for m in methods() if m.learns_next_tokens)
        raise ConfigError(
            f"train.labels is set ({cfg.train.labels!r}) but {spec.head_type} heads do not use it: they learn the "
            f"target's own distribution at every position (heads.loss says how); it applies to {', '.join(users)} "
            "heads only; remove it or change heads.head_type"
        )
    if "block_size" in method.options:  # a block longer than every row anchors nowhere: loss 0, eval NaN
        block = spec.block_size if spec.block_size is not None else spec.num_heads + 1  # DFlashHeads.for_target's rule
        if block > cfg.data.max_length:
            given = (f"heads.block_size={block}" if spec.block_size is not None
                     else f"heads.num_heads={spec.num_heads} (a block of {block}: the root + {spec.num_heads} slots)")
            raise ConfigError(
                f"{given} is longer than the rows (data.max_length={cfg.data.max_length}): no block fits in a row, so "
                f"nothing would be trained. Set heads.block_size <= data.max_length (well below it: a block needs a "
                "context before it)"
            )
    track = cfg.tracking
    if track.report_to == "tensorboard":  # the name is a folder under train.output_dir: never a path out of it
        key, name = ("run_name", track.run_name) if track.run_name is not None else ("project", track.project)
        if not name.strip() or name.strip(".") == "" or any(sep in name for sep in ("/", "\\")) or "\0" in name:
            raise ConfigError(
                f"tracking.{key}={name!r}: with tracking.report_to=tensorboard it names the log folder inside "
                f"train.output_dir, so it must be one plain folder name (no '/', '\\', '.' or '..'), e.g. "
                f"{'heads-run1'!r}"
            )
    if cfg.data.packing and cfg.train.group_by_length:  # before anything is loaded or written
        raise ConfigError(
            "data.packing and train.group_by_length are both on: packed windows have no padding to group away; "
            "turn one of them off"
        )
    if spec.feature_layers is not None and (not spec.feature_layers or min(spec.feature_layers) < 0):
        raise ConfigError(
            f"heads.feature_layers must be a non-empty list of target layer ids >= 0 (i = the hidden state entering "
            f"layer i; null = default), got {spec.feature_layers!r}; the upper bound, the target's layer count, is "
            "checked when the target is loaded"
        )
