"""Simulated vs measured acceptance length of Medusa heads on the demo target.

The simulated figure is what training logs as ``eval/simulated_acceptance``: expected tokens per
step of the heads' tree from a per-head, per-rank accuracy table (``expected_tokens_per_step``),
here measured on the target's own greedy continuations of the 12 held-out prompts that
``draftheads calibrate`` uses (demo corpus held-out files, raw text, last 128 tokens). The
measured figure is ``SpeculativeDecoder``'s mean accepted tokens per step (bonus token included)
on the same prompts. Those continuations are exactly the decoder's output (greedy decoding is
lossless), so both numbers see the same text.

    python benchmarks/simulated_acceptance.py [--heads runs/demo/heads] [--new-tokens 64]
"""
from __future__ import annotations

import argparse
import json
import time

import torch


@torch.no_grad()
def exact_tree_lengths(target, heads, seq: torch.Tensor, start: int, tree, vocab_ids) -> list[int]:
    """Diagnostics: the tokens the tree would commit (bonus included) at every position t >= start
    of ``seq`` (heads reading hidden t, root = token t+1), from the heads' actual candidates there,
    no independence assumption. Medusa heads only (they read no drafted tokens)."""
    hidden = target(seq[None], output_hidden_states=True).hidden_states[-1][0]
    top_r = 1 + max(r for path in tree for r in path)
    tops = []
    for k, state in enumerate(heads.head_states(hidden)):
        logits = heads.project(state, k)
        if vocab_ids is not None:
            tops.append(vocab_ids[logits[:, vocab_ids].topk(top_r, dim=-1).indices])
        else:
            tops.append(logits.topk(top_r, dim=-1).indices)
    n = seq.numel()
    lengths = []
    for t in range(start, n - 1):
        best = 0
        for path in tree:
            if t + 1 + len(path) < n and all(int(tops[j][t, r]) == int(seq[t + 2 + j]) for j, r in enumerate(path)):
                best = max(best, len(path))
        lengths.append(1 + best)
    return lengths


def replay(lengths: list[int]) -> tuple[int, int]:
    """(tokens, steps) of decoding that starts at the first position and jumps by each step's
    length: only the positions decoding actually visits count."""
    tokens = steps = i = 0
    while i < len(lengths):
        step = min(lengths[i], len(lengths) - i)
        tokens, steps, i = tokens + step, steps + 1, i + step
    return tokens, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", default="runs/demo/heads")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    import draftheads as dh
    from draftheads.demo import corpus_texts, resolve_target
    from draftheads.tune.calibrate import head_accuracy_table
    from draftheads.inference.tree import default_choices
    from draftheads.train.metrics import chain_acceptance_length, simulated_acceptance_length

    path = resolve_target("demo")  # cached: never rebuilt here
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    heads = dh.load_heads(args.heads, target=target).eval()
    texts = [t[:800] for t in corpus_texts("heldout")][: args.num_prompts]
    prompts = [tokenizer(t, return_tensors="pt").input_ids[:, -args.prompt_tokens :] for t in texts]

    trees = {"heads' tree (tree.json)": heads.tree, "default tree": default_choices(heads.config.num_heads),
             "chain": [[0] * d for d in range(1, heads.config.num_heads + 1)]}
    vocab_ids = heads.draft_vocab(heads.draft_vocab_size)  # rank what the proposer ranks
    rows = []
    for name, tree in trees.items():
        if tree is None:
            continue
        decoder = dh.SpeculativeDecoder(target, heads, tree=tree)
        t0 = time.perf_counter()
        outs = [decoder.generate(p, max_new_tokens=args.new_tokens, temperature=0.0, eos_token_id=[]) for p in prompts]
        lengths = [n for o in outs for n in o.accept_lengths]
        measured = sum(lengths) / len(lengths)
        acc = head_accuracy_table(target, heads, [o.sequences[0] for o in outs], max_rank=10,
                                  skip_prompt=[p.shape[-1] for p in prompts], vocab_ids=vocab_ids)
        simulated = simulated_acceptance_length(acc, tree)
        exact = [exact_tree_lengths(target, heads, o.sequences[0], p.shape[-1] - 1, tree, vocab_ids)
                 for o, p in zip(outs, prompts)]
        replayed = [replay(ls) for ls in exact]
        rows.append({
            "tree": name, "nodes": len(tree) + 1, "simulated": simulated, "measured": measured,
            "relative_error": (simulated - measured) / measured, "chain_estimate": chain_acceptance_length(acc[:, 0].tolist()),
            # diagnostics: the exact tree outcome at every position (what independence misses) and
            # the same outcomes at only the positions a decoding visits (what position-averaging misses)
            "exact_all_positions": sum(map(sum, exact)) / sum(map(len, exact)),
            "exact_replayed": sum(t for t, _ in replayed) / sum(n for _, n in replayed),
            "steps": len(lengths), "seconds": time.perf_counter() - t0, "choices": tree,
            "top1": acc[:, 0].tolist(),
        })
        print(f"{name:26s} {len(tree) + 1:2d} nodes | simulated {simulated:.3f} | measured {measured:.3f} "
              f"| error {100 * rows[-1]['relative_error']:+.1f}% | {len(lengths)} steps "
              f"| exact per position {rows[-1]['exact_all_positions']:.3f}, replayed {rows[-1]['exact_replayed']:.3f}",
              flush=True)
    result = {
        "heads": args.heads, "draft_vocab_size": heads.draft_vocab_size, "prompts": len(prompts),
        "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "threads": args.threads,
        "torch": torch.__version__, "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
