"""Deterministic per-step overhead: tensor ops dispatched outside the target forward, host reads, and
Python function calls per step, for one checkout. argv: repo"""
import os
import sys, json, inspect, importlib.util, collections
repo = sys.argv[1]
sys.path[:0] = [repo]
import torch
torch.set_num_threads(1)
import draftheads as dh
from transformers import AutoModelForCausalLM
spec = importlib.util.spec_from_file_location("hs", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../draftheads/inference/host_syncs.py"))
hs = importlib.util.module_from_spec(spec); spec.loader.exec_module(hs)
T = "/root/.cache/draftheads/demo-target-54d996a994fe"
target = AutoModelForCausalLM.from_pretrained(T, dtype=torch.float32).eval()
extra = {"draft_budget": None} if "draft_budget" in inspect.signature(dh.SpeculativeDecoder).parameters else {}
qs = [torch.tensor(json.loads(l)["ids"]) for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl"))]
for kind in sys.argv[2].split(","):
    heads = dh.load_heads(f"{os.environ.get('AB_RUNS', '/tmp/dm/runs')}/{kind}/heads", target=target)
    d = dh.SpeculativeDecoder(target, heads, batch_plan=None, **extra)
    with torch.inference_mode():
        d.generate(qs[4][None], max_new_tokens=8, eos_token_id=[])
        with hs.HostSyncCounter(target, heads) as c:
            out = d.generate(qs[4][None], max_new_tokens=64, eos_token_id=[])
        steps = out.stats["steps"]
        # python calls outside the target forward
        depth = [0]; calls = collections.Counter()
        def enter(*_): depth[0] += 1
        def leave(*_): depth[0] -= 1
        h1 = target.register_forward_pre_hook(enter); h2 = target.register_forward_hook(leave)
        def prof(frame, event, arg):
            if event == "call" and not depth[0]:
                co = frame.f_code
                calls[f"{co.co_filename.split('site-packages/')[-1].replace(repo, '')}:{co.co_name}"] += 1
        sys.setprofile(prof)
        out2 = d.generate(qs[4][None], max_new_tokens=64, eos_token_id=[])
        sys.setprofile(None); h1.remove(); h2.remove()
    print(kind, json.dumps({"steps": steps, "ops_outside_per_step": round(c.ops_outside / steps, 2),
                            "host_reads_per_step": round(c.total_outside / steps, 3), "reads": dict(c.outside),
                            "py_calls_per_step": round(sum(calls.values()) / steps, 1)}))
    if len(sys.argv) > 3:
        for k, v in sorted(calls.items(), key=lambda kv: -kv[1])[:400]:
            print(f"   {v/steps:7.2f} {k}")
