#!/bin/bash
cd /work/main
export DRAFTHEADS_NUM_THREADS=2
PY=/work/main/.venv/bin/python
out=/work/s37/runs/dflash-200-stdlib
start=$(date +%s)
$PY train.py --config configs/demo-dflash.yaml train.output_dir=$out train.max_steps=200 train.choose_tree=false train.save_every=0 train.eval_every=0 --overwrite > /work/s37/train-dflash-200-stdlib.log 2>&1
echo "rc=$? dflash-200-stdlib $(( $(date +%s) - start )) s" >> /work/s37/times.txt
export OMP_NUM_THREADS=1 DRAFTHEADS_NUM_THREADS=1
$PY /work/s37/accept.py --heads $out/heads --out /work/s37/m/accept-stdlib-t0.json > /work/s37/m/accept-stdlib-t0.log 2>&1
$PY /work/s37/accept.py --heads $out/heads --temperature 0.7 --out /work/s37/m/accept-stdlib-t0.7.json > /work/s37/m/accept-stdlib-t0.7.log 2>&1
echo done
