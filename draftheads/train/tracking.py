"""Experiment trackers: W&B (offline when no key is configured), TensorBoard, or none."""
from __future__ import annotations

import importlib.util
import netrc
import os
from pathlib import Path
from typing import Any

from ..config import TrackingConfig


def wandb_has_key() -> bool:
    """An API key in the environment or in ~/.netrc (where ``wandb login`` writes it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        auth = netrc.netrc(os.environ.get("NETRC")).authenticators("api.wandb.ai")
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return bool(auth and auth[2])


def prepare_tracker(cfg: TrackingConfig, announce=print) -> str | None:
    """The ``log_with`` value for ``Accelerator``; fixes up the environment first so that a missing
    W&B key or TensorBoard package gives a notice or a clear error instead of a crash mid-setup."""
    if cfg.report_to == "none":
        return None
    if cfg.report_to == "wandb":
        if importlib.util.find_spec("wandb") is None:
            raise RuntimeError("tracking.report_to=wandb needs the wandb package: pip install wandb")
        if not os.environ.get("WANDB_MODE") and not wandb_has_key():
            os.environ["WANDB_MODE"] = "offline"
            announce("W&B: no API key configured, logging offline (sync later with `wandb sync`)")
        return "wandb"
    if cfg.report_to == "tensorboard":
        if importlib.util.find_spec("tensorboard") is None and importlib.util.find_spec("tensorboardX") is None:
            raise RuntimeError("tracking.report_to=tensorboard needs TensorBoard: pip install tensorboard")
        return "tensorboard"
    raise ValueError(f"unknown tracking.report_to {cfg.report_to!r}")


def init_trackers(accelerator, cfg: TrackingConfig, config: dict[str, Any], output_dir: Path,
                  run_id: str | None = None) -> None:
    """Start the configured tracker. ``run_id``: the W&B run a resumed training run continues
    (``tracker_run_id`` of the run before it, kept in its checkpoints), so one training run is one
    W&B run however often it resumes. TensorBoard needs none: it appends to the same folder."""
    if cfg.report_to == "none":
        return
    init_kwargs: dict[str, Any] = {}
    if cfg.report_to == "wandb":
        init_kwargs["wandb"] = {"dir": os.environ.get("WANDB_DIR") or str(output_dir)}
        if cfg.run_name:
            init_kwargs["wandb"]["name"] = cfg.run_name
        if run_id:
            init_kwargs["wandb"].update(id=run_id, resume="allow")
    project = cfg.project if cfg.report_to == "wandb" else (cfg.run_name or cfg.project)
    accelerator.init_trackers(project, config=flat_config(config), init_kwargs=init_kwargs)


def tracker_run_id(accelerator, cfg: TrackingConfig) -> str | None:
    """The id of the W&B run ``init_trackers`` started (on the main process, which runs it), for
    the checkpoints to keep; None for the other trackers."""
    if cfg.report_to != "wandb" or not accelerator.is_main_process:
        return None
    return getattr(accelerator.get_tracker("wandb", unwrap=True), "id", None)


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested config -> ``{"train.lr": 0.001, ...}`` with scalar values (TensorBoard hparams need them)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_config(value, name + "."))
        elif value is None or isinstance(value, (list, tuple)):
            out[name] = str(value)
        else:
            out[name] = value
    return out
