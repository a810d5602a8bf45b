"""Training checkpoints (resumable state) and the final heads export.

A checkpoint is ``accelerator.save_state`` (heads weights, optimizer, scheduler, RNG states; under
DeepSpeed its own sharded format) plus ``trainer_state.json`` (step, epoch, position in the epoch,
the config), built in a temporary sibling of ``checkpoints/step-N`` and swapped into place only
when complete (draftheads/atomic.py), so a crash mid-save never leaves a folder that
``resume: auto`` would pick. A save that fails (disk full: an ``OSError``, or torch's
``RuntimeError ... unexpected pos``) removes its temporary and says so, naming the disk, its free
space and what a checkpoint needs; the earlier checkpoints stay. On resume, a checkpoint that cannot be read (truncated files, an RNG
state that does not load) is reported, and ``resume: auto`` falls back to the previous one. The
frozen target is not written (it is reloaded from its own source on resume), except under FSDP:
accelerate's sharded FSDP state dict also holds the ignored (replicated) target's weights, once
per checkpoint.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch
from accelerate.utils import RNG_STATE_NAME, DistributedType
from accelerate.utils.other import load
from safetensors import safe_open
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from ..atomic import install_folder, recover, temp_folder, write_text_atomically
from .disk import disk_note, folder_size, is_short_write

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


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says which and what to do."""


def resume_candidates(resume: str | None, output_dir: str | os.PathLike) -> list[Path]:
    """The checkpoints to try, best first: ``None`` -> none; ``"auto"`` -> every complete
    checkpoint in ``output_dir``, newest first (an unreadable one falls back to the next);
    a path -> that checkpoint alone, which must exist."""
    if resume is None:
        return []
    if resume == "auto":
        return list_checkpoints(output_dir)[::-1]
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(
            f"train.resume={resume!r} is not a checkpoint folder (no {STATE_FILE}); "
            f"use 'auto' or one of {[str(p) for p in list_checkpoints(output_dir)] or 'the step-N folders under checkpoints/'}"
        )
    return [path]


def resolve_resume(resume: str | None, output_dir: str | os.PathLike) -> Path | None:
    """The first of ``resume_candidates`` (None: start fresh)."""
    found = resume_candidates(resume, output_dir)
    return found[0] if found else None


def read_state(path: str | os.PathLike) -> dict[str, Any]:
    file = Path(path) / STATE_FILE
    try:
        state = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} cannot be read ({e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file} is not a trainer state (a JSON object)")
    return state


def _is_deepspeed(accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.DEEPSPEED


def _is_fsdp(accelerator) -> bool:
    return accelerator.distributed_type == DistributedType.FSDP


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
    """Save a resumable checkpoint atomically on every process; keep the newest ``keep``.

    A failure on any process (disk full, a read-only folder) stops every process with a
    ``CheckpointError`` that names the folder; the temporary is removed, earlier checkpoints stay."""
    root = checkpoint_root(output_dir)
    final = root / f"step-{step}"
    # one name every process agrees on (they all write into it); removed by any later write
    tmp = final.parent / f".{final.name}.tmp-save"
    error: BaseException | None = None
    if accelerator.is_main_process:
        try:
            for stale in [*root.glob(".step-*.tmp-*"), *root.glob(".tmp-step-*")]:  # earlier saves, killed
                shutil.rmtree(stale, ignore_errors=True)
            tmp = temp_folder(final, token="save")
        except OSError as e:
            error = e
    _agree_or_fail(accelerator, error, final, tmp)
    try:
        if _is_deepspeed(accelerator):
            accelerator.save_state(str(tmp), exclude_frozen_parameters=True)
        else:
            accelerator.save_state(str(tmp))
        if accelerator.is_main_process:
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    except OSError as e:
        error = e
    except RuntimeError as e:  # torch's zip writer: a full disk reads "unexpected pos" (train/disk.py)
        if not is_short_write(e):
            raise
        error = e
    _agree_or_fail(accelerator, error, final, tmp)
    if accelerator.is_main_process:
        try:
            install_folder(tmp, final)
        except OSError as e:
            error = e
        else:
            for old in list_checkpoints(output_dir)[:-keep] if keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
    _agree_or_fail(accelerator, error, final, tmp)
    return final


def record_state(accelerator, output_dir: str | os.PathLike, step: int, state: dict[str, Any]) -> Path | None:
    """Replace the trainer state of this run's checkpoint at ``step`` with ``state`` (on the main
    process, atomically): what the run learnt after it saved that step, its final evaluation and
    the best/ that evaluation chose, which a resume with a larger step budget continues from. The
    weights, optimizer and RNG states are the step's already. None when the run folder has no such
    checkpoint (``save_every: 0``, or a run resumed from another folder's checkpoint)."""
    file = checkpoint_root(output_dir) / f"step-{step}" / STATE_FILE
    written = None
    if accelerator.is_main_process and file.is_file():
        written = write_text_atomically(file, json.dumps(state, indent=2) + "\n")
    accelerator.wait_for_everyone()
    return written


def _agree_or_fail(accelerator, error: BaseException | None, final: Path, tmp: Path) -> None:
    """A collective: if any process failed to write, clean up and raise on every process."""
    failed = accelerator.reduce(torch.tensor(float(error is not None), device=accelerator.device), "sum").item()
    if not failed:
        return
    if accelerator.is_main_process:
        recover(final)  # removes the temporary (and restores a displaced old copy, if any)
        shutil.rmtree(tmp, ignore_errors=True)
    accelerator.wait_for_everyone()
    reason = f"{type(error).__name__}: {error}" if error is not None else "it failed on another process"
    hint = ""
    if is_short_write(error):
        hint = (f" (the disk is full: {disk_note(final.parent, _checkpoint_bytes(accelerator, final.parent))}; "
                "free space there or set train.output_dir on another disk, then resume)")
    raise CheckpointError(
        f"could not write checkpoint {final}: {reason}{hint}; nothing was left half-written and the "
        f"earlier checkpoints in {final.parent} are intact"
    ) from error


def _checkpoint_bytes(accelerator, root: Path) -> int:
    """About how much one checkpoint takes: the last complete one, else the trainable weights and
    AdamW's two moments of each (what ``save_state`` writes besides small RNG and schedule states)."""
    done = list_checkpoints(root.parent)
    if done:
        return folder_size(done[-1])
    params = [p for model in getattr(accelerator, "_models", []) for p in model.parameters() if p.requires_grad]
    return 3 * sum(p.numel() * p.element_size() for p in params)


def load_checkpoint(
    accelerator,
    candidates: list[Path],
    model: torch.nn.Module,
    check: Callable[[Path, dict[str, Any]], None] | None = None,
    say: Callable[[str], None] = print,
) -> tuple[Path, dict[str, Any]]:
    """Restore heads, optimizer, scheduler and RNG states from the first readable checkpoint of
    ``candidates``; return it and its trainer state. ``check(path, state)`` may refuse one (its
    error propagates). An unreadable checkpoint (truncated or corrupt files, an RNG state that
    does not load) is reported and the next candidate tried; none left: ``CheckpointError``."""
    problems = []
    for path in candidates:
        problem, state = None, {}
        try:
            state = read_state(path)
        except CheckpointError as e:
            problem = str(e)
        if problem is None and check is not None:
            check(path, state)
        if problem is None:
            problem = _unreadable(path, accelerator, model)
        if not _any_failed(accelerator, problem):
            try:
                if _is_deepspeed(accelerator):
                    accelerator.load_state(str(path), load_module_strict=False)
                else:
                    accelerator.load_state(str(path), strict=False)
            except Exception as e:  # noqa: BLE001 (any library's error for a damaged file)
                problem = f"{type(e).__name__}: {str(e)[:300]}"
            if not _any_failed(accelerator, problem):
                return path, state
        problems.append(f"{path}: {problem or 'unreadable on another process'}")
        rest = candidates[candidates.index(path) + 1 :]
        if rest:
            say(f"warning: checkpoint {path} cannot be loaded ({problem or 'on another process'}); "
                f"falling back to the previous one, {rest[0]}")  # fmt: skip
    raise CheckpointError(
        "no loadable checkpoint to resume from: " + "; ".join(problems)
        + ". Resume from another checkpoint (train.resume=PATH) or start over (--overwrite)"
    )


def _any_failed(accelerator, problem: str | None) -> bool:
    """Every process takes the same decision (a collective)."""
    flag = torch.tensor(float(problem is not None), device=accelerator.device)
    return accelerator.reduce(flag, "sum").item() > 0


def _unreadable(path: Path, accelerator, model: torch.nn.Module) -> str | None:
    """Why ``path`` cannot be resumed from exactly on this process, or None. accelerate would
    skip an RNG state that fails to load with an info-level log line and continue with another
    random stream (a resume that is silently not bit-exact): refuse it here instead."""
    rng = path / f"{RNG_STATE_NAME}_{accelerator.process_index}.pkl"
    try:
        states = load(rng)
        if not isinstance(states, dict) or "torch_manual_seed" not in states:
            raise ValueError("not an RNG state")
    except Exception as e:  # noqa: BLE001
        return f"{rng.name} does not load ({type(e).__name__}: {str(e)[:200]}), so the resumed run would not be bit-exact"
    for file in sorted(path.iterdir()):  # torch.save files are zip archives: a cut one has no central directory
        if file.suffix in (".bin", ".pt", ".pkl") and file.is_file():
            try:
                with zipfile.ZipFile(file) as archive:
                    archive.namelist()
            except (zipfile.BadZipFile, OSError) as e:
                return f"{file.name} is truncated or corrupt ({e})"
    if not _is_deepspeed(accelerator) and not _is_fsdp(accelerator):  # those two write their own shard formats
        try:
            _check_heads_keys(path, accelerator.unwrap_model(model))
        except (OSError, ValueError) as e:
            if "does not match these heads" in str(e):
                raise  # another heads config: an error, not a damaged file
            return str(e)
    return None


def _check_heads_keys(path: Path, model: torch.nn.Module) -> None:
    """``load_state(strict=False)`` tolerates the absent target weights but would also tolerate
    missing head weights: check that the file holds exactly the heads' keys."""
    file = path / "model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: {path} is not a complete checkpoint")
    try:
        with safe_open(str(file), "pt") as f:
            saved = {k.removeprefix("module.") for k in f.keys()}
            for k in f.keys():
                f.get_tensor(k)  # a truncated file fails here, with a readable message
    except Exception as e:  # noqa: BLE001 (SafetensorError and friends)
        raise OSError(f"{file} is truncated or corrupt ({type(e).__name__}: {e})") from None
    expected = {k for k in model.state_dict() if k.startswith(HEADS_PREFIX)}
    if saved != expected:
        missing, extra = sorted(expected - saved), sorted(saved - expected)
        raise ValueError(
            f"checkpoint {path} does not match these heads (missing: {missing[:5]}, unexpected: {extra[:5]}); "
            "was it written with another heads config?"
        )


def heads_state(accelerator, model: torch.nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor] | None:
    """The trained heads' full state dict on CPU: on the main process (or on every process with
    ``everywhere``), else None. Under ZeRO-3 each process holds a shard of every parameter:
    gather the heads' (small) params only, rather than ``get_state_dict`` on the whole model,
    which would gather the target too (a collective then: call on every process)."""
    heads = accelerator.unwrap_model(model).heads
    wanted = everywhere or accelerator.is_main_process
    if _is_deepspeed(accelerator) and accelerator.state.deepspeed_plugin.zero_stage == 3:
        import deepspeed  # optional: only a ZeRO-3 launch has it

        with deepspeed.zero.GatheredParameters(list(heads.parameters()), modifier_rank=None):
            return {k: v.detach().clone().cpu() for k, v in heads.state_dict().items()} if wanted else None
    if _is_fsdp(accelerator):  # the heads are one sharded flat parameter: gather it (the target is not in it)
        with FSDP.summon_full_params(model, writeback=False):
            return {k: v.detach().clone().cpu() for k, v in heads.state_dict().items()} if wanted else None
    return {k: v.detach().clone().cpu() for k, v in heads.state_dict().items()} if wanted else None


def heads_from_state(heads: torch.nn.Module, state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A fresh heads module of ``heads``' type and config holding ``state`` (no RNG draws)."""
    with torch.device("meta"):  # no RNG draws, no second allocation: weights are assigned
        copy = type(heads)(heads.config)
    copy.load_state_dict(state, strict=True, assign=True)
    return copy.use_plans(heads.plans)


def export_heads(accelerator, model: torch.nn.Module, path: str | os.PathLike) -> Path | None:
    """Write the trained heads as a heads folder (``heads.save_pretrained``) on the main process."""
    state = heads_state(accelerator, model)
    out = None
    if accelerator.is_main_process:
        copy = heads_from_state(accelerator.unwrap_model(model).heads, state)
        out = Path(copy.save_pretrained(path))
    accelerator.wait_for_everyone()
    return out
