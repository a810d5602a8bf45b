"""benchmarks/gpu.sh runs end to end at small sizes (on a CPU here), so the one-shot GPU evidence
run is known to work before a GPU is rented for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_small_run_writes_every_section(tmp_path):
    out = tmp_path / "report"
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--small", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    sections = report["sections"]
    assert set(sections) == {"exactness", "target_speedups", "verify_times", "step_overhead", "batch_throughput",
                             "static_cache", "training_throughput"}
    assert not [name for name, r in sections.items() if "error" in r]
    rows = sections["exactness"]["rows"]
    assert {r["arch"] for r in rows} == {"llama", "qwen2", "mistral", "gemma"}
    assert {r["dtype"] for r in rows} == {"float32", "bfloat16"}
    assert all(r["identical"] for r in rows if r["dtype"] == "float32"), rows
    assert set(sections["verify_times"]["seconds"]) == {"1", "16", "64", "128"}
    assert sections["step_overhead"]["medusa"]["host_reads_per_step"] <= 1.5
    assert [r["batch"] for r in sections["batch_throughput"]["rows"]] == [1, 4, 16]
    static = {r["method"]: r for r in sections["static_cache"]["rows"]}
    assert set(static) == {"dynamic", "static", "static+compile"}
    assert all(r["identical_to_generate"] and r["identical_to_dynamic"] for r in static.values()), static
    assert sections["training_throughput"]["tokens_per_s"] > 0
    assert (out / "report.md").read_text().startswith("# draftheads device evidence")
