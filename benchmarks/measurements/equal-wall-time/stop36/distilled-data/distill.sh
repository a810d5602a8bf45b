#!/bin/bash
cd /work/measure/s35 && . /work/main/.venv/bin/activate
export OMP_NUM_THREADS=1 DRAFTHEADS_NUM_THREADS=1
draftheads distill --target demo --data chunks-a.jsonl --out distilled-t0.jsonl --max-new-tokens 192 --prompt-tokens 64 --batch-size 64 --device cpu --no-progress
draftheads distill --target demo --data chunks-b.jsonl --out distilled-t1.jsonl --max-new-tokens 192 --prompt-tokens 64 --batch-size 64 --device cpu --temperature 1.0 --seed 0 --no-progress
