#!/usr/bin/env bash
# Adaptive gamma (the draft model's own rule) vs the decoder's online draft budget over up to 8 drafts.
cd /work/main; . .venv/bin/activate
export OMP_NUM_THREADS=1
D=~/.cache/draftheads/demo-draft-128x2
M=dh-draft-g0,dh-draft-g1,dh-draft-g2,dh-draft-g3,dh-draft-g4,dh-draft-auto,dh-draft-budget
for set in code repeat; do
  echo "== $set $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  python benchmarks/bench_draft_proposers.py --draft $D --threads 1 --prompt-set $set --gammas 0,1,2,3,4 --methods $M \
    --rounds 3 --out /work/measure/gamma/$set > /work/measure/gamma/$set.log 2>&1
  echo "   rc=$? $(date +%T)"
done
echo "== random $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
python benchmarks/bench_draft_proposers.py --draft $D --random-draft --threads 1 --gammas 0,1 \
  --methods dh-draft-g0,dh-draft-g1,dh-draft-auto,dh-draft-budget --rounds 3 --out /work/measure/gamma/random > /work/measure/gamma/random.log 2>&1
echo "   rc=$? $(date +%T)"
