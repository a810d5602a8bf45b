"""Held-out top-1 per draft step of equal-wall-time runs, on the corpus config's held-out windows
(configs/demo-eagle3.yaml as of b533e5d: stdlib files the target never saw, chunked windows)."""
import sys, json, torch
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
from recipe_ablation import heldout_windows, heldout_top1
from draftheads.target import load_target
torch.set_num_threads(1)
target, tok = load_target("demo")
cfg, ds = heldout_windows(tok, Path("/work/measure/s36/demo-eagle3-corpus.yaml"), 20)
out = {}
for run in sys.argv[2:]:
    r = heldout_top1(target, tok, Path("/work/walltime/runs") / run / "heads", cfg, ds)
    out[run] = r
    print(run, " ".join(f"{x:.3f}" for x in r["top1"]), flush=True)
Path(sys.argv[1]).write_text(json.dumps(out, indent=2))
