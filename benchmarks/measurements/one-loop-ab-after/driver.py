"""Interleaved A/B: old checkout vs new checkout, persistent single-thread workers, order alternating
each round; outputs checked identical. argv: rounds cases out.json old_repo new_repo"""
import statistics, subprocess, sys, json, os
PY = sys.executable
ROUNDS = int(sys.argv[1]); cases = sys.argv[2].split(","); out_path = sys.argv[3]
sides = {"old": sys.argv[4], "new": sys.argv[5]}
here = os.path.dirname(os.path.abspath(__file__))
procs = {k: subprocess.Popen([PY, os.path.join(here, "worker.py"), v], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True) for k, v in sides.items()}
for p in procs.values():
    try:
        open(f"/proc/{p.pid}/autogroup", "w").write("-15")
    except OSError as e:
        print("autogroup:", e)
for p in procs.values():
    assert p.stdout.readline().strip() == "ready"
rates = {s: {k: [] for k in sides} for s in cases}; outs = {s: {k: [] for k in sides} for s in cases}
ratios = {s: [] for s in cases}; oratios = {s: [] for s in cases}
loads = [os.getloadavg()[0]]
extras = {}
for r in range(ROUNDS):
    for size in cases:
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        got = {}
        for k in order:
            procs[k].stdin.write(size + "\n"); procs[k].stdin.flush()
            rate, o, h, ex = procs[k].stdout.readline().split()
            for key, val in json.loads(ex).items():
                extras.setdefault(size, {}).setdefault(k, {}).setdefault(key, []).append(val)
            got[k] = (float(rate), float(o), h)
            rates[size][k].append(float(rate)); outs[size][k].append(float(o))
        assert got["old"][2] == got["new"][2], "outputs differ"
        ratios[size].append(got["new"][0] / got["old"][0]); oratios[size].append(got["new"][1] / got["old"][1])
    loads.append(os.getloadavg()[0])
for p in procs.values():
    p.stdin.write("quit\n"); p.stdin.flush()
res = {"load_1min": loads}
for size, rs in ratios.items():
    os_ = oratios[size]
    res[size] = {"ratio_median": statistics.median(rs), "ratio_min": min(rs), "ratio_max": max(rs), "rounds": len(rs),
                 "old_tok_s_median": statistics.median(rates[size]["old"]), "new_tok_s_median": statistics.median(rates[size]["new"]),
                 "outside_ms_old_median": statistics.median(outs[size]["old"]), "outside_ms_new_median": statistics.median(outs[size]["new"]),
                 "outside_ratio_median": statistics.median(os_), "outside_ratio_min": min(os_), "outside_ratio_max": max(os_)}
    x = res[size]
    cr = [a / b for a, b in zip(extras[size]["new"]["cpu_tok_s"], extras[size]["old"]["cpu_tok_s"])]
    x["cpu_ratio_median"], x["cpu_ratio_min"], x["cpu_ratio_max"] = statistics.median(cr), min(cr), max(cr)
    print(f"{size}: new/old tokens per CPU-second {x['cpu_ratio_median']:.3f} [{min(cr):.3f}-{max(cr):.3f}]")
    x["extras_median"] = {side: {key: statistics.median(v) for key, v in e.items()} for side, e in extras[size].items()}
    print(size, json.dumps(x["extras_median"]))
    print(f"{size}: new/old tok/s {x['ratio_median']:.3f} [{min(rs):.3f}-{max(rs):.3f}] ({len(rs)} rounds; old {x['old_tok_s_median']:.1f}, "
          f"new {x['new_tok_s_median']:.1f}); outside-forward ms/step old {x['outside_ms_old_median']:.3f} new {x['outside_ms_new_median']:.3f} "
          f"ratio {x['outside_ratio_median']:.3f} [{min(os_):.3f}-{max(os_):.3f}]")
print("load (1-min avg) per round:", " ".join(f"{l:.2f}" for l in loads))
json.dump(res, open(out_path, "w"), indent=1)
