#!/usr/bin/env bash
cd /work/main; . .venv/bin/activate
for T in 0 0.7; do
  draftheads bench --target demo --heads /work/final/demo-medusa/heads --heads /work/final/demo-eagle/heads --prompt-lookup \
    --batch-size 1,4,8 --batches 3 --max-new-tokens 64 --max-questions 12 --temperature $T --threads 1 --seed 0 \
    --no-progress --out /work/measure/batch2/t$T --overwrite
done
