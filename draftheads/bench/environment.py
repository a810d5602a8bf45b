"""Where a benchmark ran: numbers without their machine, versions and dtype cannot be compared."""
from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch

from ..device import cpu_name


def environment(target) -> dict[str, Any]:
    import transformers

    import draftheads

    device = target.device
    env: dict[str, Any] = {
        "device": str(device),
        "dtype": str(target.dtype).replace("torch.", ""),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "draftheads": draftheads.__version__,
        # Which checkout ran: before/after comparisons from two checkouts must not import the same one.
        "draftheads_path": str(Path(draftheads.__file__).resolve().parent),
        "draftheads_commit": _git_commit(Path(draftheads.__file__).resolve().parent),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": _cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "target": getattr(target, "name_or_path", None),
        "target_parameters": sum(p.numel() for p in target.parameters()),
    }
    return env


def _cpu_count() -> int | None:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count()


def _git_commit(package_dir: Path) -> str | None:
    """The commit of the checkout the package was imported from (+ "-dirty" with local changes),
    or None outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=package_dir, capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=package_dir,
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
