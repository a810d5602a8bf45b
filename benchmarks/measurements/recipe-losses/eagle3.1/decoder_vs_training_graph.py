import torch, draftheads as dh, sys
from draftheads.target import load_target
from draftheads.bench.questions import demo_questions
torch.set_num_threads(1)
target, tok = load_target("demo", device=torch.device("cpu"), dtype="auto")
heads = dh.load_heads(sys.argv[1], target=target).eval()
q = demo_questions(tok, 2)[1]
ids = tok(q.turns[0], return_tensors="pt").input_ids[:, :100]
rec = []
orig_fwd = heads.lm_head.forward
def spy(x):
    out = orig_fwd(x); rec.append(out.detach().clone().reshape(-1, out.shape[-1])); return out
heads.lm_head.forward = spy
dec = dh.SpeculativeDecoder(target, heads, tree={"total_tokens": 2, "depth": 1, "top_k": 1}, draft_budget=None, batch_plan=None)
o = dec.generate(ids, max_new_tokens=64, eos_token_id=[])
heads.lm_head.forward = orig_fwd
seq = o.sequences
print("accepts", o.accept_lengths)
with torch.no_grad():
    out = target(seq, output_hidden_states=True)
    feats = torch.cat([out.hidden_states[k] for k in heads.feature_layers], -1)
    nxt = torch.cat([seq[:, 1:], out.logits[:, -1:].argmax(-1)], 1)
    g, a = heads.first_input(feats, nxt)
    T = seq.shape[1]
    st, _ = heads.run_layers(g, a, torch.arange(T)[None], torch.ones(T, T, dtype=torch.bool).tril()[None])
    lg = heads.logits(st)[0]
# step s's root is the token at position P_s (prompt length + tokens committed before it); its logits = teacher at P_s - 1
P = ids.shape[1]
pos = P
for s, (r, n) in enumerate(zip(rec, o.accept_lengths)):
    t = pos - 1  # teacher-forced position whose next token is this step's root
    print(s, "root pos", pos, "diff", round(float((r[0] - lg[t]).abs().max()), 5), "acc", n)
    pos += n
pred = heads.vocab_ids()[lg.argmax(-1)]
print(repr(tok.decode(seq[0, P:P+40])))
print("actual next-next:", seq[0, P+1:P+21].tolist())
print("heads predict   :", pred[P-1:P+19].tolist())
print("in draft vocab? ", [int((heads.vocab_ids() == t).any()) for t in seq[0, P+1:P+21].tolist()])
