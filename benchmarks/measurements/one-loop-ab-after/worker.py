"""One side of an interleaved A/B on the demo target: decodes on command, prints tokens/s,
outside-forward ms/step and an output hash. argv: repo"""
import inspect, json, os, sys, time
repo = sys.argv[1]
sys.path[:0] = [repo]
import torch
torch.set_num_threads(1)
import draftheads as dh
assert dh.__file__.startswith(repo), dh.__file__
from transformers import AutoModelForCausalLM
T = "/root/.cache/draftheads/demo-target-54d996a994fe"
target = AutoModelForCausalLM.from_pretrained(T, dtype=torch.float32).eval()
extra = {"draft_budget": None} if "draft_budget" in inspect.signature(dh.SpeculativeDecoder).parameters else {}
dec = {k: dh.SpeculativeDecoder(target, dh.load_heads(f"{os.environ.get('AB_RUNS', '/tmp/dm/runs')}/{k}/heads", target=target), batch_plan=None, **extra)
       for k in ("hydra", "eagle", "medusa")}
qs = [json.loads(l) for l in open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts.jsonl"))]
prompts = [torch.tensor(q["ids"]) for q in qs]
rows = prompts[:4]
width = max(len(r) for r in rows)
ids4 = torch.zeros(4, width, dtype=torch.long); mask4 = torch.zeros_like(ids4)
for i, r in enumerate(rows):
    ids4[i, width - len(r):] = r; mask4[i, width - len(r):] = 1
NEW = 64
REPS = int(os.environ.get("AB_REPS", "1"))
def run(cmd):
    kind, size = cmd.split("-")
    d = dec[kind]
    t0 = time.perf_counter(); c0 = time.thread_time()
    if size == "b1":
        outs = [d.generate(p[None], max_new_tokens=NEW, eos_token_id=[]) for p in prompts[4:7]]
    else:
        outs = [d.generate(ids4, attention_mask=mask4, max_new_tokens=NEW, eos_token_id=[])]
    s = time.perf_counter() - t0; cpu = time.thread_time() - c0
    n = sum(o.num_new_tokens for o in outs)
    steps = sum(o.stats["steps"] for o in outs)
    outside = sum(o.decode_seconds - o.target_seconds for o in outs) / steps * 1000
    extra = {"target_ms_step": sum(o.target_seconds for o in outs) / steps * 1000,
             "prefill_ms": sum(o.prefill_seconds for o in outs) / len(outs) * 1000,
             "around_ms": (s - sum(o.prefill_seconds + o.decode_seconds for o in outs)) / len(outs) * 1000,
             "steps": steps, "cpu_tok_s": n / cpu}
    return n / s, outside, hash(tuple(t for o in outs for t in o.sequences.flatten().tolist())), extra
with torch.inference_mode():
    for c in ("hydra-b1", "hydra-b4", "eagle-b1", "medusa-b1"):
        run(c)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        runs = [run(cmd) for _ in range(REPS)]  # the fastest of REPS: a preempted run says nothing about the code
        rate, out, h, extra = max(runs, key=lambda r: r[0])
        print(f"{rate:.3f} {out:.4f} {h} {json.dumps(extra, separators=(',', ':'))}", flush=True)
