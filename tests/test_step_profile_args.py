"""`benchmarks/step_profile.py` refuses a run that would measure nothing, or ignore a flag, by name,
before it loads the target (a run on a lent GPU must not spend minutes to find out)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step_profile.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,message", [
    ((), "nothing to measure"),
    (("--heads", "runs/none/heads", "--verify-vs-bare"), "--verify-vs-bare times chains of the --verify-sizes"),
])
def test_refused_by_name_before_loading(args, message):
    done = run("--target", "no-such-target", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr  # argparse's refusal, not a failed load of the target
