"""Whether the installed vLLM can serve a layout that needs its Model Runner V2.

vLLM 0.32 runs some drafters only on its V2 model runner (DSpark: "implemented only by the V2
GPU model runner"; DFlash2's candidate heads: "exist only in the V2 speculator", both in
vllm/config/vllm.py `_get_v1_model_runner_unsupported_features`), and V2 needs Triton with a
backend for the device ("Model Runner V2 requires Triton"): the CPU build, whose Triton has no CPU
backend, refuses them when the engine starts. An export for such a layout asks the installed vLLM
first (`require_runner`) and refuses, naming what it lacks, rather than write a folder the engine
at hand would refuse. ``export_heads(..., engine_check=False)`` (``draftheads export
--no-engine-check``) writes it anyway, for a machine whose vLLM has the runner.

"Installed" is the vLLM this Python imports, else vLLM's own venv (``$DRAFTHEADS_VLLM_PYTHON`` or
a ``.venv-vllm``, as ``draftheads distill --engine vllm`` finds it). With none there is nothing
to check against, and the export is written.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

from ..data.vllm_python import candidate_pythons
from ..export.common import ExportError

PROBE = """
import json
import vllm
from vllm.triton_utils import HAS_TRITON
from vllm.model_executor.models.registry import _SPECULATIVE_DECODING_MODELS
print("DRAFTHEADS-PROBE " + json.dumps({"version": vllm.__version__, "triton": bool(HAS_TRITON),
                                         "architectures": sorted(_SPECULATIVE_DECODING_MODELS)}))
"""


@dataclass(frozen=True)
class InstalledVLLM:
    """What the probe read of an installed vLLM."""

    python: str
    version: str
    has_triton: bool
    architectures: frozenset[str]

    @property
    def has_v2_runner(self) -> bool:
        return self.has_triton


@lru_cache(maxsize=1)
def installed_vllm() -> InstalledVLLM | None:
    """The installed vLLM (see the module docstring), probed once per process; None when there is none."""
    if importlib.util.find_spec("vllm") is not None:
        python = sys.executable
    else:
        found = [p for p in candidate_pythons() if p.is_file() and os.access(p, os.X_OK)]
        if not found:
            return None
        python = str(found[0])
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=300, env=env,
                              cwd=os.path.expanduser("~"))
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("DRAFTHEADS-PROBE ")), None)
    if proc.returncode != 0 or line is None:
        return None  # a broken vLLM install is not a verdict on the heads
    got = json.loads(line.split(" ", 1)[1])
    return InstalledVLLM(python, got["version"], got["triton"], frozenset(got["architectures"]))


def require_runner(title: str, architecture: str) -> None:
    """Refuse, naming it, an installed vLLM that cannot run ``architecture`` drafts (``title``: the
    method's name): one without the class, or without Model Runner V2."""
    engine = installed_vllm()
    if engine is None:
        return
    override = ("pass engine_check=False to export_heads (draftheads export --no-engine-check) to write it for a "
                "machine whose vLLM has it")
    if architecture not in engine.architectures:
        raise ExportError(f"the installed vLLM {engine.version} ({engine.python}) has no {architecture} draft model "
                          f"({title} needs vLLM 0.32 or later); {override}")
    if not engine.has_v2_runner:
        raise ExportError(
            f"{title} drafts run only on vLLM's Model Runner V2, which needs Triton on a GPU; the installed vLLM "
            f"{engine.version} ({engine.python}) has no Triton backend for this device (its CPU build runs the V1 runner "
            f"only) and would refuse the folder when the engine starts; {override}"
        )
