"""What a training run is built from: the frozen target, fresh (or continued) heads, and the
token statistics that size EAGLE-3's draft vocabulary.

Also used by ``draftheads cache-features``, which builds the same heads only to learn what they
read from the target.
"""
from __future__ import annotations

import contextlib

import torch

from ..config import HeadsSpec, TargetConfig
from ..heads import load_heads
from ..heads.eagle import target_final_norm
from ..heads.init import apply_init
from ..registry import method_named
from ..target import load_target as load_target_model


def load_target(cfg: TargetConfig, accelerator=None, device: torch.device | None = None):
    """The frozen target and its tokenizer as ``cfg`` says (see draftheads/target.py)."""
    return load_target_model(
        cfg.name_or_path,
        device=device,
        dtype=cfg.dtype,
        runs_on=accelerator.device if accelerator is not None else None,
        trust_remote_code=cfg.trust_remote_code,
        revision=cfg.revision,
        attn_implementation=cfg.attn_implementation,
        resolving=accelerator.main_process_first() if accelerator is not None else None,  # built once
    )


def build_heads(spec: HeadsSpec, target: torch.nn.Module, zero3: bool = False, tokenizer=None) -> torch.nn.Module:
    """Fresh heads of ``spec``'s type for ``target``; ``tokenizer`` settles options chosen from it
    (P-EAGLE's mask token)."""
    cls = method_named(spec.head_type).heads
    options = {name: getattr(spec, name) for name in cls.spec_options}  # what this head type takes
    options = cls.resolve_options(options, target, tokenizer)
    with gathered([target.get_output_embeddings().weight], zero3):  # it sizes the heads and seeds some of them
        heads = cls.for_target(target, num_heads=spec.num_heads, num_layers=spec.num_layers, **options)
        return apply_init(heads, spec.init, target)  # heads.init (draftheads/heads/init.py)


def gathered(params: list[torch.nn.Parameter], zero3: bool):
    """A context in which ``params`` of the target are whole: a target loaded sharded (ZeRO-3)
    gathers them, any other already is."""
    if not zero3:
        return contextlib.nullcontext()
    import deepspeed  # optional: only a ZeRO-3 launch has it

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def start_lm_head_from_target(heads: torch.nn.Module, target: torch.nn.Module, zero3: bool = False) -> str:
    """`heads.lm_head_init: target` on fresh heads whose draft vocabulary is set; returns what was
    copied, for the run's log."""
    norm = getattr(target_final_norm(target), "weight", None)
    params = [target.get_output_embeddings().weight] + ([norm] if isinstance(norm, torch.nn.Parameter) else [])
    with gathered(params, zero3):
        copied_norm = heads.start_lm_head_from_target(target)
    rows = heads.draft_to_target.numel()
    return f"LM head: the target's {rows} rows of the draft vocabulary" + (
        ", final norm: the target's" if copied_norm else " (the target has no final norm gain of that size to copy)")


def init_heads_from(heads: torch.nn.Module, path: str, target: torch.nn.Module) -> torch.nn.Module:
    """The heads folder ``path`` (saved or imported) to continue training, loaded strictly and
    checked against ``target``. What the config sets (type, sizes, feature layers, draft vocabulary,
    fc bias) must equal what ``path`` holds: an error names every difference. The draft layer's
    geometry comes from ``path`` (an imported EAGLE layer may differ from the target's); the training
    settings (EAGLE's unrolled steps, feature noise) from the config."""
    saved = load_heads(path, target=target)
    mine, theirs = heads.config, saved.config
    problems = _init_from_differences(mine, theirs, path)
    if problems:
        raise ValueError(f"heads.init_from: {path} does not match the configured heads:\n  - " + "\n  - ".join(problems))
    theirs.num_heads = mine.num_heads  # EAGLE: draft steps unrolled in training (no tensors depend on it)
    for key in ("noise", "loss_gamma", "loss", "num_anchors", "greedy_path"):  # training settings come from the config
        if key in mine.extra:
            theirs.extra[key] = mine.extra[key]
    return saved


def _init_from_differences(mine, theirs, path: str) -> list[str]:
    """Every setting in which the configured heads (``mine``) and the folder's differ."""
    problems = [
        f"{name}: config has {getattr(mine, name)!r}, {path} has {getattr(theirs, name)!r}"
        for name in ("head_type", "num_layers", "hidden_size", "vocab_size", "lm_head")
        if getattr(mine, name) != getattr(theirs, name)
    ]
    if method_named(mine.head_type).heads.weights_per_head and mine.num_heads != theirs.num_heads:
        problems.append(f"num_heads: config has {mine.num_heads}, {path} has {theirs.num_heads}")
    for key in ("feature_layers", "draft_vocab_size", "fc_bias", "block_size", "mask_token_id", "fc_norm", "norm_output",
                "norm_before_fc"):
        # EAGLE heads saved before the option had an fc bias; EAGLE-3 heads saved before EAGLE 3.1 compute neither
        default = True if key == "fc_bias" else False if key in ("fc_norm", "norm_output", "norm_before_fc") else None
        # (an unset dflash mask token takes the folder's)
        if key in mine.extra and mine.extra[key] is not None and mine.extra[key] != theirs.extra.get(key, default):
            problems.append(f"heads.{key}: config has {mine.extra[key]!r}, {path} has {theirs.extra.get(key)!r}")
    return problems


def training_token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """How often each token id is a trained (loss-masked) token in ``dataset``; the same on every
    process (a full pass over the tokenized split, no randomness)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in dataset.with_format("torch").iter(batch_size=1024):
        for ids, mask in zip(row["input_ids"], row["loss_mask"]):
            counts += torch.bincount(ids[mask.bool()].long(), minlength=vocab_size)[:vocab_size]
    return counts
