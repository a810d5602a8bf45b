#!/usr/bin/env bash
# Every method vs plain generate at T = 0, 0.7, 1.0, heads as a user gets them (their tree.json, default decoder).
set -u
cd /work/main; . .venv/bin/activate
export OMP_NUM_THREADS=1
H=""
for h in /work/final/demo-medusa /work/final/demo-hydra /work/final/demo-eagle /work/final/demo-eagle3 /work/runs2/demo-eagle3-800 /work/runs2/demo-peagle-800 /work/runs2/demo-dflash-800; do H="$H --heads $h/heads"; done
for T in "$@"; do
  echo "== T=$T $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  python -m draftheads.cli bench --target demo $H --prompt-lookup --temperature $T --max-new-tokens 128 --warmup 1 \
     --threads 1 --seed 0 --no-progress --overwrite --out /work/final3/bench-t$T > /work/final3/bench-t$T.log 2>&1
  echo "   rc=$? $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
