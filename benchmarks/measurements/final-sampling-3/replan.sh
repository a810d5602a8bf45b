#!/usr/bin/env bash
# Re-choose the plans today's code changes (EAGLE/EAGLE-3: chains in the CPU grid; DFlash: draft vocabularies).
cd /work/main; . .venv/bin/activate
for n in ${NAMES:-eagle eagle3 dflash}; do
  h=/work/final5/demo-$n; [ -f /work/final5/tree-before-$n.json ] || cp $h/heads/tree.json /work/final5/tree-before-$n.json
  echo "== $n $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  OMP_NUM_THREADS=1 timeout 900 python -m benchmarks.training_plans --heads $h/heads --write --out /work/final5/replan-$n > /work/final5/replan-$n.log 2>&1
  echo "   rc=$? $(date +%T)"; tail -6 /work/final5/replan-$n.log | cut -c1-250
done
