#!/usr/bin/env bash
# Every shipped-config head type (200 steps) and prompt lookup vs plain generate at the given temperatures,
# heads as a user gets them (their tree.json, default decoder), 3 interleaved rounds per prompt
# (ROUNDS=1 NAME=steps: the one-round run the steps-by-mode figures come from).
set -u
cd /work/main; . .venv/bin/activate
export OMP_NUM_THREADS=1
H=""
for h in /work/final5/demo-medusa /work/final5/demo-hydra /work/final5/demo-eagle /work/final5/demo-eagle3 /work/final5/demo-eagle31 /work/final5/demo-peagle /work/final5/demo-dflash; do H="$H --heads $h/heads"; done
for T in "$@"; do
  echo "== T=$T $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  python -m draftheads.cli bench --target demo $H --prompt-lookup --temperature $T --max-new-tokens 128 --warmup 1 \
     --rounds ${ROUNDS:-3} --threads 1 --seed 0 --no-progress --overwrite --out /work/final5/${NAME:-bench}-t$T > /work/final5/${NAME:-bench}-t$T.log 2>&1
  echo "   rc=$? $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
