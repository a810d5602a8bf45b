cd /work/main; . .venv/bin/activate
for T in 0.7 1.0; do
OMP_NUM_THREADS=1 python benchmarks/bench_draft_budget.py --target ~/.cache/draftheads/demo-target-54d996a994fe --heads eagle=/work/final/demo-eagle/heads --heads medusa=/work/final/demo-medusa/heads --variants "full,budget,budget:decay=0.9,budget:decay=0.95" --temperatures $T --seeds 1 --num-prompts 12 --threads 1 --out /work/measure/decay/eagle-t$T
done
OMP_NUM_THREADS=1 python benchmarks/bench_draft_budget.py --target ~/.cache/draftheads/demo-target-54d996a994fe --heads lookup=prompt-lookup --variants "full,budget,budget:decay=0.9,budget:decay=0.95" --temperatures 0 --seeds 1 --num-prompts 12 --threads 1 --out /work/measure/decay/pl-t0
