#!/usr/bin/env bash
# Batches 1/4/8 with the plans and the online budget, 2 rounds per batch.
cd /work/main; . .venv/bin/activate
export OMP_NUM_THREADS=1
for T in "$@"; do
  echo "== T=$T $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  draftheads bench --target demo --heads /work/final5/demo-medusa/heads --heads /work/final5/demo-eagle/heads --prompt-lookup \
    --batch-size 1,4,8 --batches 3 --rounds 2 --max-new-tokens 64 --max-questions 12 --temperature $T --threads 1 --seed 0 \
    --no-progress --out /work/final5/batch-t$T --overwrite > /work/final5/batch-t$T.log 2>&1
  echo "   rc=$? $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
