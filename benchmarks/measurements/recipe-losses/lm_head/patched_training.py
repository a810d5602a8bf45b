"""Scratch: EAGLE-3 (3.1 recipe) with its LM head (and final norm) started from the target's rows."""
import sys, torch
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main")
import recipe_ablation as ra
from draftheads.train import trainer

MODE = sys.argv[1]  # "lm" or "lm+norm"
orig = trainer.Trainer.build_heads_and_optimizer
def patched(self):
    orig(self)
    h, tgt = self.heads, self.target
    with torch.no_grad():
        ids = h.draft_to_target
        h.lm_head.weight.copy_(tgt.get_output_embeddings().weight[ids].float())
        if "norm" in MODE:
            h.norm.weight.copy_(tgt.model.norm.weight.float())
    self.say(f"PATCH {MODE}: lm_head from target rows")
trainer.Trainer.build_heads_and_optimizer = patched
SEEDS = [int(x) for x in sys.argv[2].split(",")]
for s in SEEDS:
    name = f"lm{MODE}@seed{s}"
    ra.ARMS[name] = ra.ARMS["eagle3.1"] + (f"train.seed={s}",)
sys.argv = ["x", "--workdir", "/work/lmhead", "--train-only", "--arms", ",".join(f"lm{MODE}@seed{s}" for s in SEEDS)]
ra.main()
