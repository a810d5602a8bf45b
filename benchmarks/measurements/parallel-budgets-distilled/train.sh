#!/bin/bash
# Issue 21's budgets: every head type at 200 steps, the parallel drafters and EAGLE-3 at 2x/4x,
# on the demo target's own text (the data configs/demo-eagle(3).yaml train on). Sequential, 2 threads.
cd /work/main
export DRAFTHEADS_NUM_THREADS=2
PY=/work/main/.venv/bin/python
DIST="data.path=demo-distilled data.eval_path=demo data.eval_split=heldout data.max_samples=null data.chunk_text=false"
run() {  # name config steps [overrides...]
  name=$1; cfg=$2; steps=$3; shift 3
  out=/work/s37/runs/$name
  [ -f $out/heads/config.json ] && { echo "skip $name"; return; }
  echo "=== $name $(date +%T)"
  start=$(date +%s)
  $PY train.py --config $cfg train.output_dir=$out train.max_steps=$steps train.choose_tree=false \
      train.save_every=0 train.eval_every=0 "$@" --overwrite > /work/s37/train-$name.log 2>&1
  echo "rc=$? $name $(( $(date +%s) - start )) s" | tee -a /work/s37/times.txt
}
run dflash-200  configs/demo-dflash.yaml 200 $DIST
run eagle3-200  configs/demo-eagle3.yaml 200
run eagle-200   configs/demo-eagle.yaml 200
run medusa-200  configs/demo.yaml 200
run peagle-800  configs/demo-peagle.yaml 800 $DIST
run dflash-800  configs/demo-dflash.yaml 800 $DIST
run eagle3-800  configs/demo-eagle3.yaml 800
run peagle-400  configs/demo-peagle.yaml 400 $DIST
run dflash-400  configs/demo-dflash.yaml 400 $DIST
echo "done $(date +%T)"
