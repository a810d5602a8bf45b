import sys, json, torch
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
from recipe_ablation import heldout_windows, heldout_top1
from draftheads.target import load_target
torch.set_num_threads(2)
target, tok = load_target("demo")
cfg, ds = heldout_windows(tok, Path("/work/main/configs/demo-eagle3.yaml"), 20)
out = {}
for name in sys.argv[1].split(","):
    for s in ["", "-seed1", "-seed2"]:
        d = Path("/work/walltime/runs") / (name + s) / "heads"
        r = heldout_top1(target, tok, d, cfg, ds)
        out[name + s] = r
        print(name + s, " ".join(f"{x:.3f}" for x in r["top1"]), flush=True)
Path("/work/measure/s34/heldout-" + sys.argv[1].replace(",", "+") + ".json").write_text(json.dumps(out, indent=2))
