"""One side of the interleaved A/B on the demo target: decodes on command, prints tokens/s. argv: repo, new(0/1)"""
import sys, time, os, json
repo, new = sys.argv[1], sys.argv[2] == "1"
sys.path[:0] = [repo]
import torch
torch.set_num_threads(1)
import draftheads as dh
from transformers import AutoModelForCausalLM
T = "/root/.cache/draftheads/demo-target-54d996a994fe"
target = AutoModelForCausalLM.from_pretrained(T, dtype=torch.float32).eval()
extra = {"draft_budget": None} if new else {}
dec = {k: dh.SpeculativeDecoder(target, dh.load_heads(f"/tmp/dm/runs/{k}/heads", target=target), batch_plan=None, **extra)
       for k in ("hydra", "eagle")}
qs = [json.loads(l) for l in open("/tmp/ab2/prompts.jsonl")]
prompts = [torch.tensor(q["ids"]) for q in qs]
rows = prompts[:4]
width = max(len(r) for r in rows)
ids4 = torch.zeros(4, width, dtype=torch.long); mask4 = torch.zeros_like(ids4)
for i, r in enumerate(rows):
    ids4[i, width - len(r):] = r; mask4[i, width - len(r):] = 1
NEW = 64
def run(cmd):
    kind, size = cmd.split("-")
    d = dec[kind]
    t0 = time.perf_counter()
    if size == "b1":
        outs = [d.generate(p[None], max_new_tokens=NEW, eos_token_id=[]) for p in prompts[4:7]]
    else:
        outs = [d.generate(ids4, attention_mask=mask4, max_new_tokens=NEW, eos_token_id=[])]
    s = time.perf_counter() - t0
    n = sum(o.num_new_tokens for o in outs)
    return n / s, hash(tuple(t for o in outs for t in o.sequences.flatten().tolist()))
with torch.inference_mode():
    for c in ("hydra-b1", "hydra-b4", "eagle-b1"):
        run(c)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        rate, h = run(cmd)
        print(f"{rate:.3f} {h}", flush=True)
