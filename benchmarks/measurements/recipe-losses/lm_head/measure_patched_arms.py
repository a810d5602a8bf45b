import sys
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import recipe_ablation as ra
arms = sys.argv[1]
for a in arms.split(","):
    if a not in ra.ARMS:
        base, _, seed = a.partition("@seed")
        ra.ARMS[a] = ra.ARMS["eagle3.1"] + (f"train.seed={seed}", f"PATCH:{base}")
sys.argv = ["recipe_ablation.py", "--workdir", "/work/lmhead", "--arms", arms, "--threads", "2"] + sys.argv[2:]
ra.main()
