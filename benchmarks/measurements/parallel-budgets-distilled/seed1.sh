#!/bin/bash
# A second training seed for the best parallel drafter (DFlash, 800 steps), benched beside EAGLE and EAGLE-3 (200).
cd /work/main
PY=/work/main/.venv/bin/python
DIST="data.path=demo-distilled data.eval_path=demo data.eval_split=heldout data.max_samples=null data.chunk_text=false"
out=/work/s37/runs/dflash-800-seed1
start=$(date +%s)
DRAFTHEADS_NUM_THREADS=2 $PY train.py --config configs/demo-dflash.yaml train.output_dir=$out train.max_steps=800 train.choose_tree=false \
  train.save_every=0 train.eval_every=0 train.seed=1 $DIST --overwrite > /work/s37/train-dflash-800-seed1.log 2>&1
echo "rc=$? dflash-800-seed1 $(( $(date +%s) - start )) s" >> /work/s37/times.txt
export OMP_NUM_THREADS=1 DRAFTHEADS_NUM_THREADS=1
M=/work/s37/m
$PY -m benchmarks.training_plans --heads $out/heads --write --out $M/plan-dflash-800-seed1 > $M/plan-dflash-800-seed1.log 2>&1
R=/work/s37/runs
$PY -m draftheads.cli bench --target demo --heads $R/eagle-200/heads --heads $R/eagle3-200/heads --heads $R/dflash-800/heads --heads $out/heads \
  --temperature 0 --max-new-tokens 128 --warmup 1 --rounds 2 --threads 1 --seed 0 --no-progress --overwrite --out $M/bench-seed1-t0 > $M/bench-seed1-t0.log 2>&1
echo "done rc=$?"
