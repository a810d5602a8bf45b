"""The five distilled-data seeds side by side: seeds 0-2 (distilled-3seeds/, data given by --set, the same
rows the shipped demo-distilled builds) and 3-4 (shipped-seeds3-4/, the shipped configs as they are)."""
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
files = [HERE / "distilled-3seeds" / "results.json", *sorted((HERE / "shipped-seeds3-4").glob("seed*.json"))]
runs, looping = {}, None
for f in files:
    d = json.loads(f.read_text())
    runs.update(d["runs"])
    assert looping in (None, d["looping_prompts"])
    looping = d["looping_prompts"]
seeds = sorted({int(k.split()[-1]) for k in runs})
lines = ["| temperature | shape | EAGLE-3 mean (per seed) | EAGLE mean (per seed) | paired difference: mean (SE) | seeds EAGLE-3 >= EAGLE |",
         "|---:|---|---|---|---|---:|"]
for t in ("T=0", "T=1"):
    for shape in ("chain", "tree"):
        groups = [("all 12 prompts", None)]
        if t == "T=0":
            groups += [(f"{len(looping)} looping", True), (f"{12 - len(looping)} not looping", False)]
        for label, want in groups:
            def fig(name, s):
                r = runs[f"{name} seed {s}"][t][shape]
                if want is None:
                    return r["mean_accepted"]
                idx = [i for i in range(len(r["per_prompt"])) if (i in looping) == want]
                return sum(r["per_prompt"][i] for i in idx) / len(idx)
            e3 = [fig("eagle3", s) for s in seeds]
            e = [fig("eagle", s) for s in seeds]
            diff = [a - b for a, b in zip(e3, e)]
            se = statistics.stdev(diff) / len(diff) ** 0.5
            lines.append(f"| {t[2:]} | {shape}, {label} | {statistics.mean(e3):.2f} ({' / '.join(f'{x:.2f}' for x in e3)}) "
                         f"| {statistics.mean(e):.2f} ({' / '.join(f'{x:.2f}' for x in e)}) "
                         f"| {statistics.mean(diff):+.2f} ({se:.2f}) | {sum(d >= 0 for d in diff)} of {len(diff)} |")
out = "\n".join(lines)
print(out)
note = ("Means over seeds; a seed's 'all 12 prompts' figure is over its steps, its looping / not looping "
        "figures are the mean of those prompts' own means.")
(HERE / "distilled-5seeds.md").write_text(f"`python {Path(__file__).name}` (seeds {seeds})\n\n{note}\n\n{out}\n")
