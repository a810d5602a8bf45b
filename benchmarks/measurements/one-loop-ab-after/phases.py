"""Per-phase host time of one decode step in the one loop (new checkout only): median us per step."""
import os
import sys, json, time, statistics, collections
repo = sys.argv[1]; sys.path[:0] = [repo]
import torch
torch.set_num_threads(1)
import draftheads as dh
from draftheads.inference import loop
from transformers import AutoModelForCausalLM
T = "/root/.cache/draftheads/demo-target-54d996a994fe"
target = AutoModelForCausalLM.from_pretrained(T, dtype=torch.float32).eval()
qs = [torch.tensor(json.loads(l)["ids"]) for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl"))]
acc = collections.defaultdict(list)
def wrap(name, fn):
    def f(*a, **k):
        t = time.perf_counter(); r = fn(*a, **k); acc[name].append(time.perf_counter() - t); return r
    return f
for name in ("draft_depths", "accept_rows", "path_tokens", "inform", "emit", "drop_finished"):
    setattr(loop, name, wrap(name, getattr(loop, name)))
class Store:
    def __init__(s, inner): s.inner = inner
    def __getattr__(s, k):
        v = getattr(s.inner, k)
        return wrap("store." + k, v) if callable(v) else v
class Prop(Store):
    def __getattr__(s, k):
        v = getattr(s.inner, k)
        return wrap("prop." + k, v) if callable(v) else v
orig_decode = loop.decode
def decode(store, proposer, ids, settings):
    return orig_decode(Store(store), Prop(proposer), ids, settings)
import draftheads.inference.decoder as decm
decm.decode = decode
step = loop.step
loop.step = wrap("step", step)
for kind in sys.argv[2].split(","):
    acc.clear()
    d = dh.SpeculativeDecoder(target, dh.load_heads(f"{os.environ.get('AB_RUNS', '/tmp/dm/runs')}/{kind}/heads", target=target), batch_plan=None, draft_budget=None)
    with torch.inference_mode():
        for p in qs[4:10]:
            d.generate(p[None], max_new_tokens=64, eos_token_id=[])
    steps = len(acc["step"])
    print(kind, "steps", steps, " ".join(f"{k}={statistics.median(v)*1e6:.0f}" for k, v in acc.items() if len(v) >= steps // 2))
