"""Training checkpoints (resumable state) and the final heads export.

A checkpoint is ``accelerator.save_state`` (heads weights, optimizer, scheduler, RNG states; under
DeepSpeed its own sharded format) plus ``trainer_state.json`` (step, epoch, position in the epoch),
written into ``checkpoints/.tmp-step-N`` and renamed to ``checkpoints/step-N`` only when complete,
so a crash mid-save never leaves a folder that ``resume: auto`` would pick. The frozen target is
never written: it is reloaded from its own source on resume.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
HEADS_PREFIX = "heads."
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoint_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints (those with a state file), oldest first."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / STATE_FILE).is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_resume(resume: str | None, output_dir: str | os.PathLike) -> Path | None:
    """``None`` -> no resume; ``"auto"`` -> the latest checkpoint in ``output_dir`` (or none yet);
    a path -> that checkpoint, which must exist."""
    if resume is None:
        return None
    if resume == "auto":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(
            f"train.resume={resume!r} is not a checkpoint folder (no {STATE_FILE}); "
            f"use 'auto' or one of {[str(p) for p in list_checkpoints(output_dir)] or 'the step-N folders under checkpoints/'}"
        )
    return path


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    return json.loads((Path(path) / STATE_FILE).read_text())


def _is_deepspeed(accelerator) -> bool:
    from accelerate.utils import DistributedType

    return accelerator.distributed_type == DistributedType.DEEPSPEED


def register_heads_only(accelerator) -> None:
    """Make ``save_state`` keep only the heads' weights (not the multi-GB frozen target).

    Non-DeepSpeed only; under DeepSpeed ``exclude_frozen_parameters`` does the same."""

    def drop_target(models, weights, output_dir):
        for state in weights:
            for key in list(state):
                if not key.removeprefix("module.").startswith(HEADS_PREFIX):
                    del state[key]

    accelerator.register_save_state_pre_hook(drop_target)


def save_checkpoint(accelerator, output_dir: str | os.PathLike, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Save a resumable checkpoint atomically on every process; keep the newest ``keep``."""
    root = checkpoint_root(output_dir)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    if _is_deepspeed(accelerator):
        accelerator.save_state(str(tmp), exclude_frozen_parameters=True)
    else:
        accelerator.save_state(str(tmp))
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: str | os.PathLike, model: torch.nn.Module) -> dict[str, Any]:
    """Restore heads, optimizer, scheduler and RNG states from ``path``; return its trainer state."""
    path = Path(path)
    if _is_deepspeed(accelerator):
        accelerator.load_state(str(path), load_module_strict=False)
    else:
        _check_heads_keys(path, accelerator.unwrap_model(model))
        accelerator.load_state(str(path), strict=False)
    return read_state(path)


def _check_heads_keys(path: Path, model: torch.nn.Module) -> None:
    """``load_state(strict=False)`` tolerates the absent target weights but would also tolerate
    missing head weights: check that the file holds exactly the heads' keys."""
    from safetensors import safe_open

    file = path / "model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: {path} is not a complete checkpoint")
    with safe_open(str(file), "pt") as f:
        saved = {k.removeprefix("module.") for k in f.keys()}
    expected = {k for k in model.state_dict() if k.startswith(HEADS_PREFIX)}
    if saved != expected:
        missing, extra = sorted(expected - saved), sorted(saved - expected)
        raise ValueError(
            f"checkpoint {path} does not match these heads (missing: {missing[:5]}, unexpected: {extra[:5]}); "
            "was it written with another heads config?"
        )


def export_heads(accelerator, model: torch.nn.Module, path: str | os.PathLike) -> Path | None:
    """Write the trained heads as a heads folder (``heads.save_pretrained``) on the main process.

    Under ZeRO-3 each process holds a shard of every parameter: gather the heads' (small) params
    only, rather than ``get_state_dict`` on the whole model, which would gather the target too."""
    heads = accelerator.unwrap_model(model).heads
    state = None
    if _is_deepspeed(accelerator) and accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(heads.parameters()), modifier_rank=None):
            if accelerator.is_main_process:
                state = {k: v.detach().clone().cpu() for k, v in heads.state_dict().items()}
    elif accelerator.is_main_process:
        state = {k: v.detach().cpu() for k, v in heads.state_dict().items()}
    out = None
    if accelerator.is_main_process:
        with torch.device("meta"):  # no RNG draws, no second allocation: weights are assigned
            copy = type(heads)(heads.config)
        copy.load_state_dict(state, strict=True, assign=True)
        copy.tree = getattr(heads, "tree", None)
        out = Path(copy.save_pretrained(path))
    accelerator.wait_for_everyone()
    return out
