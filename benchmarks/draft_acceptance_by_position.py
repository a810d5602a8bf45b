"""How often a draft model's k-th drafted token is accepted, given the k-1 before it were.

    python benchmarks/draft_acceptance_by_position.py --draft ~/.cache/draftheads/demo-draft-128x2 \\
        [--target demo] [--prompt-set code|repeat] [--num-prompts 12] [--gammas 1,2,4,8] [--per-prompt]

No timing, no decoding loop: the target writes its greedy continuation of each prompt, the draft
reads prompt + continuation once (teacher forcing), and a[t] says whether the draft's argmax at
position t is the target's token. Greedy chain speculation with draft length g is then a scan over
a: a step starts after the target's own token, accepts drafts while a is 1 (at most g), and the
target's token at the first 0 (or its bonus token after g hits) starts the next step. Counting,
per position k of a step, how often it is reached and accepted gives the conditional acceptance
rates; their running products are what the decoder's draft budget estimates online
(`OnlineDraftBudget.reach`: the share of steps reaching each depth).

Why this exists: on the demo pair these rates are far from one constant. The draft is right on
its first token ~88% of the time, on its second 44-65%, on later ones 85-99% (code prompts), and
they vary by prompt: some continuations alternate hit/miss, others are copied lines the draft
gets entirely right. A single geometric acceptance rate mispredicts both. The same rates measured
in the real decode loop (`DraftModelProposer`, fixed gamma) match these to two decimals.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).parent))
from bench_draft_proposers import load_prompts  # noqa: E402  (the same prompt sets as the benchmark)


def agreement(target, draft, prompt: torch.Tensor, new_tokens: int, pad: int) -> list[bool]:
    """a[i]: the draft's greedy token after prompt + the target's first i new tokens equals the
    target's token i (teacher-forced agreement along the target's own greedy continuation)."""
    out = target.generate(
        prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new_tokens,
        min_new_tokens=new_tokens, pad_token_id=pad, eos_token_id=None,
    )
    n = prompt.shape[1]
    guess = draft(out).logits[0, n - 1 : -1].argmax(-1)
    return (guess == out[0, n:]).tolist()


def scan(a: list[bool], gamma: int) -> tuple[collections.Counter, collections.Counter]:
    """Positions reached / accepted by greedy chain steps of length ``gamma`` over agreements ``a``.
    Token 0 comes from the prefill; the first step drafts token 1."""
    reached, accepted = collections.Counter(), collections.Counter()
    i = 1
    while i < len(a):
        k = 0
        while k < gamma and i + k < len(a):
            reached[k + 1] += 1
            if not a[i + k]:
                break
            accepted[k + 1] += 1
            k += 1
        i += k + 1  # the accepted drafts, then the target's own token (correction or bonus)
    return reached, accepted


def rates(reached, accepted) -> str:
    return "  ".join(f"{k}: {accepted[k] / reached[k]:.2f} ({reached[k]})" for k in sorted(reached))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo")
    ap.add_argument("--draft", required=True)
    ap.add_argument("--prompt-set", choices=["code", "repeat"], default="code")
    ap.add_argument("--prompts", help="text file, prompts separated by blank lines (instead of --prompt-set)")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gammas", default="1,2,4,8")
    ap.add_argument("--per-prompt", action="store_true", help="also print each prompt's rates and its hit/miss string")
    args = ap.parse_args()
    from draftheads.demo import resolve_target

    path = resolve_target(args.target)
    target = AutoModelForCausalLM.from_pretrained(path).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft).eval()
    tok = AutoTokenizer.from_pretrained(path)
    prompts, described = load_prompts(args, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    with torch.inference_mode():
        seqs = [agreement(target, draft, p, args.max_new_tokens, pad) for p in prompts]
    hits = sum(map(sum, seqs))
    total = sum(map(len, seqs))
    print(f"{described}; {args.max_new_tokens} new tokens")
    print(f"teacher-forced agreement: {hits / total:.3f} over {total} tokens")
    pairs = collections.Counter((x, y) for a in seqs for x, y in zip(a, a[1:]))
    for prev in (True, False):
        n = pairs[(prev, True)] + pairs[(prev, False)]
        print(f"  P(hit | previous {'hit' if prev else 'miss'}) = {pairs[(prev, True)] / max(n, 1):.2f}")
    print("acceptance of draft position k given 1..k-1 accepted (steps reaching k):")
    for g in (int(x) for x in args.gammas.split(",")):
        reached, accepted = collections.Counter(), collections.Counter()
        for a in seqs:
            r, c = scan(a, g)
            reached.update(r)
            accepted.update(c)
        print(f"  gamma {g}: {rates(reached, accepted)}")
    if args.per_prompt:
        g = max(int(x) for x in args.gammas.split(","))
        for i, a in enumerate(seqs):
            r, c = scan(a, g)
            print(f"prompt {i}: agreement {sum(a) / len(a):.2f}; gamma {g}: {rates(r, c)}")
            print("   " + "".join("1" if x else "." for x in a))


if __name__ == "__main__":
    main()
