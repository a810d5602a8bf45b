"""``distill --engine vllm`` from the main environment: run the command in vLLM's own Python.

vLLM pins its own torch and transformers, so the project keeps it in a separate virtual
environment (``scripts/setup_vllm_env.sh`` makes ``<repo>/.venv-vllm``). When ``vllm`` is not
importable here but such a Python exists, the distill command runs again there: the same
arguments, this package first on ``PYTHONPATH`` (that venv does not install it), vLLM's CPU
settings in the environment, its progress streaming to this terminal. Without one, the error
names the set-up script.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from .engines import VLLM_MISSING, DistillError

#: Set in the child, so a child without vllm fails instead of starting another child.
CHILD_FLAG = "DRAFTHEADS_VLLM_CHILD"
PYTHON_ENV = "DRAFTHEADS_VLLM_PYTHON"
#: vLLM's CPU defaults for this use: one process (no engine-core subprocess), a KV cache (GiB)
#: that holds a 64-prompt batch of a small model's answers, its start-up log kept to warnings (the
#: distill's own progress is what the user reads). Values already set are kept. Threads are
#: left to vLLM (one, unless OMP_NUM_THREADS says otherwise): on a shared 2-core machine two OpenMP
#: threads measured 10x slower than one (2.3 vs 25 tok/s), their barriers spinning while the other
#: thread waits for a core.
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "WARNING"}
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding draftheads/


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def candidate_pythons() -> list[Path]:
    """Where a vLLM Python is looked for, in order: $DRAFTHEADS_VLLM_PYTHON, then a .venv-vllm in
    the repository this package is run from, in the current folder, and beside this Python's venv."""
    env = os.environ.get(PYTHON_ENV)
    if env:
        return [Path(env)]
    here = Path(sys.prefix)
    return [root / ".venv-vllm" / "bin" / "python" for root in (PACKAGE_ROOT, Path.cwd(), here.parent)]


def find_vllm_python() -> Path:
    """The Python to run vLLM with, or a DistillError naming the set-up script."""
    tried = candidate_pythons()
    for path in tried:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    where = f"${PYTHON_ENV}={tried[0]} does not exist" if os.environ.get(PYTHON_ENV) else (
        "no vLLM venv at " + ", ".join(str(p) for p in tried)
    )
    raise DistillError(VLLM_MISSING.format(err=f"no module named 'vllm'; {where}"))


def run_in_vllm_python(argv: Sequence[str]) -> int:
    """``draftheads <argv>`` in the vLLM Python; returns its exit status (output streams through)."""
    if os.environ.get(CHILD_FLAG):
        raise DistillError(VLLM_MISSING.format(err=f"no module named 'vllm' in {sys.executable}"))
    python = find_vllm_python()
    env = {**os.environ, CHILD_FLAG: "1"}
    for key, value in VLLM_ENV.items():
        env.setdefault(key, value)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    print(f"vllm is not installed here: running the distill in {python} (set {PYTHON_ENV} to choose another)",
          flush=True)
    return subprocess.call([str(python), "-m", "draftheads.cli", *argv], env=env)
