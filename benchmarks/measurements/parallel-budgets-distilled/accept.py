"""Mean accepted tokens per step (chain and tree, full drafts, no budget) for heads folders, on the
12 held-out demo prompts, greedy (checked equal to generate) or sampled. Uses recipe_ablation's
decode_stats: parallel drafters get a chain of 5 and a 10-node tree (ranks 0/1 per depth),
EAGLE/EAGLE-3 a 5-chain and a 16-token dynamic tree."""
import json, sys, argparse, torch
sys.path.insert(0, "/work/main/benchmarks")
from recipe_ablation import prompts, decode_stats
from draftheads.target import load_target

ap = argparse.ArgumentParser()
ap.add_argument("--heads", action="append", required=True)
ap.add_argument("--temperature", type=float, default=0.0)
ap.add_argument("--out", required=True)
a = ap.parse_args()
torch.set_num_threads(1)
target, tok = load_target("demo")
ps = prompts(tok, 12)
refs = None if a.temperature > 0 else [target.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=128) for p in ps]
res = {}
for h in a.heads:
    res[h] = decode_stats(target, h, ps, refs, 128, a.temperature)
    print(h, {k: round(v["mean_accepted"], 3) for k, v in res[h].items()}, "reach", [round(x, 2) for x in res[h]["chain"]["reach"]], flush=True)
json.dump(res, open(a.out, "w"), indent=1)
