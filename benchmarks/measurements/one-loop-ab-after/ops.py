"""Tensor ops outside the target forward per step, by name (one checkout). argv: repo kind"""
import os
import sys, json, inspect, collections
repo = sys.argv[1]; sys.path[:0] = [repo]
import torch
from torch.utils._python_dispatch import TorchDispatchMode
torch.set_num_threads(1)
import draftheads as dh
from transformers import AutoModelForCausalLM
target = AutoModelForCausalLM.from_pretrained("/root/.cache/draftheads/demo-target-54d996a994fe", dtype=torch.float32).eval()
extra = {"draft_budget": None} if "draft_budget" in inspect.signature(dh.SpeculativeDecoder).parameters else {}
qs = [torch.tensor(json.loads(l)["ids"]) for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl"))]
depth = [0]; ops = collections.Counter()
target.register_forward_pre_hook(lambda *_: depth.__setitem__(0, depth[0] + 1))
target.register_forward_hook(lambda *_: depth.__setitem__(0, depth[0] - 1))
class M(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not depth[0]: ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))
kind = sys.argv[2]
d = dh.SpeculativeDecoder(target, dh.load_heads(f"{os.environ.get('AB_RUNS', '/tmp/dm/runs')}/{kind}/heads", target=target), batch_plan=None, **extra)
with torch.inference_mode():
    d.generate(qs[4][None], max_new_tokens=8, eos_token_id=[])
    with M():
        out = d.generate(qs[4][None], max_new_tokens=64, eos_token_id=[])
s = out.stats["steps"]
for k, v in sorted(ops.items(), key=lambda kv: -kv[1]):
    print(f"{v/s:7.2f} {k}")
