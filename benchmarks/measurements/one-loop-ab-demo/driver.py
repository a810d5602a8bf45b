"""Interleaved A/B of the decode loop: old (main worktree) vs new (loop branch), same process
settings, same model and heads; order alternates every round. Prints per-size ratio new/old."""
import statistics, subprocess, sys, json
PY = "/work/main/.venv/bin/python"
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 10
sides = {"old": "/tmp/ab2/old", "new": "/work/main"}
procs = {k: subprocess.Popen([PY, "/tmp/ab2/worker.py", v, "1" if k == "new" else "0"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True) for k, v in sides.items()}
for p in procs.values():
    assert p.stdout.readline().strip() == "ready"
rates = {s: {k: [] for k in sides} for s in (sys.argv[2].split(",") if len(sys.argv) > 2 else ("hydra-b1", "hydra-b4", "eagle-b1"))}
ratios = {s: [] for s in rates}
for r in range(ROUNDS):
    for size in rates:
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        got = {}
        for k in order:
            procs[k].stdin.write(size + "\n"); procs[k].stdin.flush()
            rate, h = procs[k].stdout.readline().split()
            got[k] = (float(rate), 0.0, h)
            rates[size][k].append(float(rate))
        assert got["old"][2] == got["new"][2], "outputs differ"
        ratios[size].append(got["new"][0] / got["old"][0])
for p in procs.values():
    p.stdin.write("quit\n"); p.stdin.flush()
res = {}
for size, rs in ratios.items():
    res[size] = {"ratio_median": statistics.median(rs), "ratio_min": min(rs), "ratio_max": max(rs), "rounds": len(rs),
                 "old_tok_s_median": statistics.median(rates[size]["old"]), "new_tok_s_median": statistics.median(rates[size]["new"])}
    print(f"{size}: new/old tokens/s median {res[size]['ratio_median']:.3f} [{min(rs):.3f}-{max(rs):.3f}] over {len(rs)} rounds; "
          f"old {res[size]['old_tok_s_median']:.1f}, new {res[size]['new_tok_s_median']:.1f} tok/s")
json.dump(res, open(sys.argv[3] if len(sys.argv) > 3 else "/tmp/ab2/result.json", "w"), indent=1)
