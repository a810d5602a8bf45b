#!/usr/bin/env bash
# Parallel drafters at 1x and 4x the demo budget (200 / 800 steps), one thread, sequential.
set -u
cd /work/main
. .venv/bin/activate
export DRAFTHEADS_NUM_THREADS=1 OMP_NUM_THREADS=1
for spec in dflash:200 peagle:200 dflash:800 peagle:800; do
  name=${spec%%:*}; steps=${spec##*:}
  out=/work/runs2/demo-$name-$steps
  echo "== $name $steps $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  /usr/bin/time -f "%e s wall %U s user" python train.py --config configs/demo-$name.yaml train.output_dir=$out \
      train.max_steps=$steps train.eval_every=$((steps/2)) train.save_every=$((steps/2)) > $out.log 2>&1
  echo "   rc=$? $(date +%T) $(tail -1 $out.log)"
done
