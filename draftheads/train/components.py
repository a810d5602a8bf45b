"""What a training run is built from: the frozen target, fresh (or continued) heads, and the
token statistics that size EAGLE-3's draft vocabulary.

Also used by ``draftheads cache-features``, which builds the same heads only to learn what they
read from the target.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..config import HeadsSpec, TargetConfig
from ..heads import load_heads
from ..heads.config import target_final_norm
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


def check_mask_token_absent(mask_id: int, splits: dict[str, Any], tokenizer=None) -> None:
    """Refuse a parallel drafter's mask token that occurs anywhere in the rendered rows (prompts and
    chat-template headers included, not only the trained tokens): the draft reads its input
    embeddings of the whole row, so a mask slot would look like that real token there."""
    for split, dataset in splits.items():
        if dataset is None or len(dataset) == 0:
            continue
        seen, rows, first = 0, 0, None
        for start, batch in enumerate_batches(dataset):
            for offset, ids in enumerate(batch["input_ids"]):
                n = list(ids).count(mask_id)
                if n:
                    seen, rows = seen + n, rows + 1
                    first = start + offset if first is None else first
        if seen:
            piece = ""
            if tokenizer is not None and mask_id < len(tokenizer):
                piece = f" ({tokenizer.convert_ids_to_tokens(int(mask_id))!r})"
            raise ValueError(
                f"heads.mask_token_id {mask_id}{piece} occurs {seen} time(s) in the rendered {split} rows ({rows} of "
                f"{len(dataset)} rows, the first at tokenized row {first + 1}), prompts and chat-template headers "
                "included: a mask slot would read as that real token. Set heads.mask_token_id to an id the data never "
                "holds (a reserved special token, or an embedding row past the tokenizer's tokens)"
            )


def enumerate_batches(dataset, size: int = 1024):
    """(first row index, batch of plain Python rows) over ``dataset`` in order."""
    for start in range(0, len(dataset), size):
        yield start, dataset[start : start + size]


def check_something_to_learn(model, dataset, collator, spec: HeadsSpec, batch_size: int = 64) -> None:
    """Refuse a run none of whose rows holds a position the heads are trained on (every loss 0,
    every evaluation NaN, heads exported as if trained). Stops at the first row that has one: the
    cost of a healthy run is one batch. ``model``: the `TargetWithHeads` (its ``loss_counts``)."""
    longest = 0
    for start, batch in enumerate_batches(dataset, batch_size):
        rows = [{"input_ids": ids, "loss_mask": mask} for ids, mask in zip(batch["input_ids"], batch["loss_mask"])]
        longest = max([longest] + [len(r["input_ids"]) for r in rows])
        tensors = collator(rows)
        counts = model.loss_counts(tensors["input_ids"], tensors.get("attention_mask"), tensors.get("loss_mask"))
        if bool(counts.sum() > 0):
            return
    block = getattr(model.heads, "block_size", None)  # heads that draft a block in one forward (DFlash)
    if block is not None:
        why = (f"a {spec.head_type} block (heads.block_size={block}) needs a trained token with {block - 1} more positions of its "
               f"row after it, and the longest row here has {longest} tokens. Lower heads.block_size, or train on "
               "longer rows")
    else:
        why = (f"its rows (the longest has {longest} tokens) are too short for what {spec.head_type} heads predict "
               f"(heads.num_heads={spec.num_heads}), or their loss masks hold no trained token. Use longer rows or "
               "fewer heads")
    raise ValueError(f"the training data has no position to train on: none of its {len(dataset)} rows does, so every "
                     f"step's loss would be 0 and nothing learnt; {why}")
