#!/usr/bin/env bash
cd /work/main; . .venv/bin/activate
export OMP_NUM_THREADS=1 DRAFTHEADS_NUM_THREADS=1
for n in medusa eagle; do
  echo "== $n $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  draftheads calibrate --target demo --heads /work/final6/demo-$n/heads --batch-sizes 1,4,8 --temperatures 0,0.7 > /work/final6/cal-$n.log 2>&1
  echo "   rc=$? $(date +%T)"; grep -i "batch\|->" /work/final6/cal-$n.log | tail -12
done
