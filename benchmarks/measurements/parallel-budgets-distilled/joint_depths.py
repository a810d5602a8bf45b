"""Decode-mode vs training-mode per-depth top-1 of P-EAGLE heads on the target's greedy continuations."""
import sys, torch
sys.path.insert(0, "/work/main/benchmarks")
from recipe_ablation import prompts
from draftheads import load_heads
from draftheads.target import load_target
from draftheads.inference.proposers.peagle import depth_accuracy_table
from draftheads.inference.features import FeatureTap
from draftheads.train.peagle_loss import element_states

torch.set_num_threads(1)
heads_dir = sys.argv[1]
target, tok = load_target("demo")
heads = load_heads(heads_dir, target=target).eval()
D = heads.config.num_heads
ps = prompts(tok, 12)
seqs = [target.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=128)[0] for p in ps]
acc = depth_accuracy_table(target, heads, seqs, max_rank=1, skip_prompt=[p.shape[1] for p in ps])
print("decode-mode top1 per depth:", [round(float(x), 3) for x in acc[:, 0]])
# training mode: full chains at every anchor
tap = FeatureTap(target, heads.feature_layers)
hit = torch.zeros(D); tot = torch.zeros(D)
with torch.no_grad():
    for p, s in zip(ps, seqs):
        with tap.capture() as got:
            out = target(s[None], **tap.forward_kwargs())
        feats = tap.features(got, out)
        feats = heads.fuse(feats) if False else feats
        n = s.numel() - 1
        am = torch.ones(1, s.numel(), dtype=torch.long)
        chains = [(torch.arange(n)[None], torch.ones(1, n, dtype=torch.bool)) for _ in range(1, D)]
        try:
            state, anchor, depth, real = element_states(heads, feats, s[None], am, chains)
        except Exception as e:
            print("element_states failed", e); raise
        logits = heads.logits(state)
        pred = heads.vocab_ids()[logits.argmax(-1)][0]
        for i in range(anchor.shape[1]):
            a, d = int(anchor[0, i]), int(depth[i])
            lab = a + 2 + d
            if a + 1 < p.shape[1] or lab >= s.numel():
                continue
            tot[d] += 1; hit[d] += int(pred[i] == s[lab])
print("train-mode top1 per depth:", [round(float(x), 3) for x in hit / tot])
# joint: per root, hits at depth 1 and 2
from draftheads.inference.proposers.peagle import PEagleProposer
from draftheads.inference.sampling import SamplingParams
both = n1 = n2 = tot = 0
shown = 0
for p, s in zip(ps, seqs):
    with torch.no_grad(), tap.capture() as got:
        out = target(s[None], **tap.forward_kwargs())
    f = tap.features(got, out)[0]
    pr = PEagleProposer(heads)
    st = p.shape[1]
    pr.start(s[:st], f[:st], SamplingParams(), None)
    for root in range(st, s.numel() - 3):
        sc = pr.draft_scores(int(s[root]), D)
        top = pr.vocab_ids[sc.argmax(-1)]
        h1, h2 = int(top[0] == s[root + 1]), int(top[1] == s[root + 2])
        tot += 1; n1 += h1; n2 += h2; both += h1 * h2
        if h1 and not h2 and shown < 8:
            shown += 1
            print(repr(tok.decode(s[root-8:root+1])), "->", repr(tok.decode(top[:3])), "true", repr(tok.decode(s[root+1:root+4])))
        pr.accepted(s[root:root+1], f[root:root+1])
print(f"roots {tot}: P1 {n1/tot:.3f} P2 {n2/tot:.3f} P12 {both/tot:.3f}")
