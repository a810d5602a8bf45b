#!/usr/bin/env bash
# One prepared evidence run for an accelerator (under 8 minutes on an H200); also runs on a CPU.
#   benchmarks/gpu.sh [--small] [--out DIR] [--target smollm2 --heads HEADS_DIR [--questions mt-bench]]
# --small: tiny sizes, for a CPU and CI (tests/test_gpu_script.py). Writes DIR/report.{md,json}.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="gpu-report-$(date -u +%Y%m%dT%H%M%SZ)"
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --small|--target|--heads|--questions|--sections)
      if [[ "$1" == --small ]]; then args+=("$1"); shift; else args+=("$1" "$2"); shift 2; fi ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "gpu.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-python}"
mkdir -p "$out"
"$python" - <<'PY' > "$out/environment.txt" 2>&1 || true
import platform, torch, transformers
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
exec "$python" "$here/gpu_report.py" --out "$out" "${args[@]}"
