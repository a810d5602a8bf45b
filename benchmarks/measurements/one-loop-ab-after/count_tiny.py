"""Per-step tensor ops / host reads / Python calls outside the target forward on the tests' tiny
Llama (random weights; Medusa self-distilled, Hydra and EAGLE untrained). argv: repo"""
import os
import sys, json, inspect, importlib.util, collections
repo = sys.argv[1]; HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [repo, HERE + "/../../../tests"]
import torch
torch.set_num_threads(1)
import draftheads as dh
assert dh.__file__.startswith(repo)
from inference_utils import tiny_target, self_distilled_heads
spec = importlib.util.spec_from_file_location("hs", HERE + "/../../../draftheads/inference/host_syncs.py")
hs = importlib.util.module_from_spec(spec); spec.loader.exec_module(hs)
target = tiny_target("llama")
medusa, prompts = self_distilled_heads(target)
torch.manual_seed(0)
heads = {"medusa": medusa, "hydra": dh.HydraHeads.for_target(target, num_heads=3), "eagle": dh.EagleHead.for_target(target)}
extra = {"draft_budget": None} if "draft_budget" in inspect.signature(dh.SpeculativeDecoder).parameters else {}
for kind, h in heads.items():
    d = dh.SpeculativeDecoder(target, h, batch_plan=None, **extra)
    ids = prompts[:1]
    with torch.inference_mode():
        d.generate(ids, max_new_tokens=8, eos_token_id=[])
        with hs.HostSyncCounter(target, h) as c:
            out = d.generate(ids, max_new_tokens=40, eos_token_id=[])
        depth = [0]; calls = [0]
        h1 = target.register_forward_pre_hook(lambda *_: depth.__setitem__(0, depth[0] + 1))
        h2 = target.register_forward_hook(lambda *_: depth.__setitem__(0, depth[0] - 1))
        def prof(frame, event, arg):
            if event == "call" and not depth[0]:
                calls[0] += 1
        sys.setprofile(prof); out2 = d.generate(ids, max_new_tokens=40, eos_token_id=[]); sys.setprofile(None)
        h1.remove(); h2.remove()
    s = out.stats["steps"]
    print(kind, json.dumps({"steps": s, "ops_outside_per_step": round(c.ops_outside / s, 1),
                            "host_reads_per_step": round(c.total_outside / s, 2), "py_calls_per_step": round(calls[0] / s, 1),
                            "seq_hash": hash(tuple(out.sequences[0].tolist()))}))
