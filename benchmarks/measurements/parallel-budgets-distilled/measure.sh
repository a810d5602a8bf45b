#!/bin/bash
# After train.sh: acceptance at every budget, the plans training would choose, the side-by-side
# bench against plain generate, and the per-step profile (draft cost). One job at a time, 1 thread.
cd /work/main
while pgrep -f "s37/train.sh" > /dev/null; do sleep 20; done
export OMP_NUM_THREADS=1 DRAFTHEADS_NUM_THREADS=1
PY=/work/main/.venv/bin/python
R=/work/s37/runs
M=/work/s37/m; mkdir -p $M
echo "== accept T=0 $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
ALL="$R/eagle3-200/heads $R/eagle3-800/heads $R/peagle-200/heads $R/peagle-400/heads $R/peagle-800/heads $R/dflash-200/heads $R/dflash-400/heads $R/dflash-800/heads $R/eagle-200/heads /work/peagle-dist/runs/peagle/heads"
H=""; for h in $ALL; do H="$H --heads $h"; done
$PY /work/s37/accept.py $H --out $M/accept-t0.json > $M/accept-t0.log 2>&1
echo "== accept T=0.7 $(date +%T)"
$PY /work/s37/accept.py $H --temperature 0.7 --out $M/accept-t0.7.json > $M/accept-t0.7.log 2>&1
echo "== plans $(date +%T)"
for n in medusa-200 eagle-200 eagle3-200 peagle-200 dflash-200 peagle-800 dflash-800 eagle3-800; do
  h=$R/$n/heads; [ -L $R/$n ] && { rm $R/$n; cp -r /work/peagle-dist/runs/peagle+distilled $R/$n; }
  timeout 900 $PY -m benchmarks.training_plans --heads $h --write --out $M/plan-$n > $M/plan-$n.log 2>&1
  echo "   $n rc=$? $(date +%T)"; tail -5 $M/plan-$n.log | cut -c1-200
done
for T in 0 0.7; do
  echo "== bench T=$T $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  B=""; for n in medusa-200 eagle-200 eagle3-200 peagle-200 dflash-200 eagle3-800 peagle-800 dflash-800; do B="$B --heads $R/$n/heads"; done
  $PY -m draftheads.cli bench --target demo $B --temperature $T --max-new-tokens 128 --warmup 1 --rounds 2 --threads 1 \
     --seed 0 --no-progress --overwrite --out $M/bench-t$T > $M/bench-t$T.log 2>&1
  echo "   rc=$? $(date +%T)"
done
echo "== profile $(date +%T)"
P="--heads $R/peagle-800/heads --heads $R/dflash-800/heads --heads $R/peagle-200/heads --heads $R/dflash-200/heads"
$PY benchmarks/parallel_step_profile.py $P --heads $R/eagle3-200/heads --heads $R/eagle-200/heads --prompts 8 --max-new-tokens 128 --threads 1 --out $M/profile-t0-saved > $M/profile-t0-saved.log 2>&1
$PY benchmarks/parallel_step_profile.py $P --chain --prompts 8 --max-new-tokens 128 --threads 1 --out $M/profile-t0-chain > $M/profile-t0-chain.log 2>&1
echo "done $(date +%T)"
