"""Where the draft budget spends a batch's steps (modes per generation): `diag.py T BATCH [HEADS]`,
prompt lookup unless a heads folder is given; against plain steps through our loop and full drafts."""
import json, sys, time, statistics
import torch
import draftheads as dh
from draftheads.target import load_target
from draftheads.bench.questions import demo_questions
from draftheads.bench.batch import BatchBench, batches_of
from draftheads.bench.methods import Method
from draftheads.inference.inputs import left_pad
from draftheads.inference.draft_budget import DraftBudget

torch.set_num_threads(1)
T = float(sys.argv[1]) if len(sys.argv) > 1 else 0.7
size = int(sys.argv[2]) if len(sys.argv) > 2 else 4
target, tok = load_target("demo", device=torch.device("cpu"), dtype="auto")
qs = demo_questions(tok, num=12)

class Plain(DraftBudget):
    name = "forced-plain"
    def choose(self, rows): return 0

def drafter():
    return dh.load_heads(sys.argv[3], target=target) if len(sys.argv) > 3 else dh.PromptLookupProposer()

methods = [Method("pl-auto", dh.SpeculativeDecoder(target, drafter())),
           Method("pl-plainsteps", dh.SpeculativeDecoder(target, drafter(), draft_budget=Plain())),
           Method("pl-full", dh.SpeculativeDecoder(target, drafter(), draft_budget=None))]
bench = BatchBench(target, tok, methods, 64, T, 0, use_chat_template=False)
prompts = bench.prompts(qs)
groups = batches_of(prompts, size, None)
ratios = {m.name: [] for m in methods}
with torch.inference_mode():
    ids, mask = left_pad(groups[0], bench.pad_id)
    bench._plain(ids, mask)
    for m in methods: bench._method(m, ids, mask, 0)
    for rnd in range(int(sys.argv[4]) if len(sys.argv) > 4 else 3):
        for gi, g in enumerate(groups):
            ids, mask = left_pad(g, bench.pad_id)
            _, tp = bench._timed(bench._plain, ids, mask)
            for m in methods:
                out, s = bench._timed(bench._method, m, ids, mask, 100 * rnd + gi)
                ratios[m.name].append(tp / s * out.num_new_tokens / (size * 64))
                if m.name == "pl-auto":
                    b = out.stats.get("draft_budget", {})
                    print(rnd, gi, f"plain {tp:.3f}s {m.name} {s:.3f}s acc {out.mean_accept_length:.2f}", b.get("steps"), "probes", b.get("probes"), "meas", b.get("plain_measurements"), "reach", b.get("reach")[:4] if b.get("reach") else None, flush=True)
for k, v in ratios.items():
    print(k, "median", round(statistics.median(v), 3), "min", round(min(v), 3), "max", round(max(v), 3))
dec = methods[0].decoder
for key, bud in dec._budgets.items():
    print(key[1:], {r: {c: round(s * 1000, 1) for c, s in bud.step_costs(r).items()} for r in bud._seconds})
