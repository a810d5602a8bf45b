"""EAGLE heads: the plan's tree vs chains of depth 3/5/7, speed vs generate, interleaved, default budget."""
import statistics, sys, time, json
import torch
import draftheads as dh
from draftheads.target import load_target
from draftheads.bench.questions import demo_questions

torch.set_num_threads(1)
heads_dir = sys.argv[1]; T = float(sys.argv[2]); rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
shapes = json.loads(sys.argv[4])
target, tok = load_target("demo", device=torch.device("cpu"), dtype="auto")
heads = dh.load_heads(heads_dir, target=target)
prompts = [tok(q.turns[0], return_tensors="pt").input_ids for q in demo_questions(tok, 12)]
decs = {name: dh.SpeculativeDecoder(target, heads, tree=shape, batch_plan=None) for name, shape in shapes.items()}
def plain(ids, seed):
    torch.manual_seed(seed)
    kw = {"do_sample": False} if T == 0 else {"do_sample": True, "temperature": T, "top_k": 0, "top_p": 1.0}
    return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=128, **kw)
for d in decs.values(): d.generate(prompts[0], max_new_tokens=16, temperature=T, top_k=0, top_p=1.0, seed=0)
plain(prompts[0], 0)
ratios = {n: [] for n in decs}; acc = {n: [] for n in decs}; exact = {n: 0 for n in decs}
for r in range(rounds):
    for i, ids in enumerate(prompts):
        seed = 1000 * r + i
        t0 = time.perf_counter(); ref = plain(ids, seed); tp = time.perf_counter() - t0
        for n, d in decs.items():
            t0 = time.perf_counter()
            out = d.generate(ids, max_new_tokens=128, temperature=T, top_k=0, top_p=1.0, seed=seed)
            s = time.perf_counter() - t0
            ratios[n].append(tp / s * out.num_new_tokens / (ref.shape[1] - ids.shape[1]))
            acc[n] += out.accept_lengths
            exact[n] += int(T == 0 and torch.equal(out.sequences, ref))
for n in decs:
    v = ratios[n]
    print(f"{n:12s} T={T} median {statistics.median(v):.3f} min {min(v):.3f} max {max(v):.3f} total-ish {statistics.fmean(v):.3f} "
          f"accepted {statistics.fmean(acc[n]):.2f} exact {exact[n]}/{len(v)}", flush=True)
