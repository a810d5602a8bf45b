cd /work/main; . .venv/bin/activate
for h in /work/final/demo-medusa /work/final/demo-hydra /work/final/demo-eagle /work/final/demo-eagle3 /work/runs2/demo-dflash-800 /work/runs2/demo-peagle-800; do
  n=$(basename $h); cp $h/heads/tree.json /work/measure/tree-before-$n.json
  OMP_NUM_THREADS=1 timeout 900 python -m benchmarks.training_plans --heads $h/heads --write --out /work/measure/replan-$n > /work/measure/replan-$n.log 2>&1
  echo "== $n"; tail -5 /work/measure/replan-$n.log | head -4 | cut -c1-200
done
