"""Where one speculative step's time goes, per heads folder: draft, verify, host, and what it
accepts; and what one verify forward costs by tree size.

For each ``--heads`` folder (any head type, with its saved tree unless ``--chain``) this decodes
the prompts (benchmarks/prompts.py: the first turns of ``--questions``) with the draft budget and
the heads' plan OFF (every step drafts in
full, so acceptance is the heads' own, not the budget's), interleaved with plain ``generate`` on the same prompts,
and prints per step:

- accepted tokens (drafts accepted + the bonus) and P(depth d accepted) for d = 1..max depth;
- draft ms (the batch proposer's ``propose`` calls, wall clock), verify ms (the target's verify forward),
  host ms (the rest of the step: acceptance, cache commits, bookkeeping);
- draft / one target forward, where one target forward is plain ``generate``'s time per token
  on the same prompts (its step: one forward plus its own host work);
- the speedup over plain ``generate`` (time per new token, summed over the prompts).

    python benchmarks/step_profile.py --heads runs/smollm2/heads [--heads DIR ...] [--target smollm2] \
        [--questions mt-bench] [--num-prompts 12] [--chain] [--temperature 0.7] [--out DIR] \
        [--draft-vocab-size none --draft-vocab-size 1024] [--verify-sizes 1,2,4,8,16,32,64 [--verify-vs-bare]]

``--draft-vocab-size N`` (repeatable; ``none`` = the whole vocabulary): profile static-tree heads
(DFlash, Medusa) drafting from the N most frequent training tokens, each size in turn.

``--verify-sizes``: the median seconds of one verify forward of n tree tokens over a cached context
of the prompts' mean length (``tune.calibrate.measure_verify_times``, what calibrate's tree search
reads), beside n = 1: the price of each drafted token, which decides how large a tree can pay.
``--verify-vs-bare`` adds, for chains of the same sizes, the verifier's forward beside a bare
transformers forward over the same cache (interleaved rounds, medians, no running maximum): what
the verifier itself adds to the model's own forward.

Greedy outputs are checked against ``generate`` (a mismatch raises: a profile of wrong output
means nothing).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from prompts import add_arguments, load_prompts


def verify_costs(target, sizes: list[int], context: int) -> dict:
    """Milliseconds of one verify forward per tree size, and each as a multiple of a 1-token forward."""
    from draftheads.tune.calibrate import measure_verify_times

    seconds = measure_verify_times(target, sorted(set([1, *sizes])), context=context)
    return {"verify_ms_by_tree_tokens": {n: 1e3 * s for n, s in seconds.items()},
            "over_one_token": {n: s / seconds[1] for n, s in seconds.items()}, "context": context}


def verify_vs_bare(target, sizes: list[int], context: int, rounds: int = 25) -> dict:
    """Median ms of a chain of n tokens verified by `TreeVerifier.forward` and of the same n tokens
    through a bare ``target(input_ids, past_key_values=cache)``, over one ``context``-token cache,
    the two interleaved round by round (the chain's tree mask is the causal one: no mask is built)."""
    import statistics

    from draftheads.inference.recurrent import keep_prefix
    from draftheads.inference.tree import Tree, TreeShape
    from draftheads.inference.verify import TreeVerifier

    verifier = TreeVerifier(target)
    gen = torch.Generator().manual_seed(0)
    vocab = target.get_output_embeddings().weight.shape[0]
    cache = verifier.new_cache()
    with torch.no_grad():
        target(input_ids=torch.randint(0, vocab, (1, context), generator=gen), use_cache=True,
               **{verifier.cache_arg: cache})
    samples: dict[str, dict[int, list[float]]] = {"verifier": {n: [] for n in sizes}, "bare": {n: [] for n in sizes}}
    with torch.no_grad():
        for r in range(rounds + 2):  # the first two rounds warm up
            for n in sizes:
                tokens = torch.randint(0, vocab, (n,), generator=gen)
                runs = {"verifier": lambda: verifier.forward(cache, Tree(TreeShape(tuple(range(-1, n - 1))), tokens), context),
                        "bare": lambda: target(input_ids=tokens[None], use_cache=True, **{verifier.cache_arg: cache})}
                for name in (("verifier", "bare") if r % 2 == 0 else ("bare", "verifier")):
                    t0 = time.perf_counter()
                    runs[name]()
                    if r >= 2:
                        samples[name][n].append(time.perf_counter() - t0)
                    keep_prefix(cache, context)  # drop the chain again, as calibrate's timing does
    return {"chain_ms": {name: {n: 1e3 * statistics.median(xs) for n, xs in by_n.items()}
                         for name, by_n in samples.items()}, "context": context, "rounds": rounds}


def _timed_propose(cls, box: dict):
    """Wrap ``cls.propose`` so every call adds its wall seconds to ``box['draft']``."""
    original = cls.propose

    def propose(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            box["draft"] += time.perf_counter() - t0

    cls.propose = propose
    return original


def profile(target, tokenizer, heads_dir: str, prompts, max_new: int, temperature: float, chain: bool, seed: int,
            vocab: str | None = None):
    """``vocab``: None = the heads as saved; "none" = the whole vocabulary; a number = that draft vocabulary."""
    import draftheads as dh
    from draftheads.inference.decoder import SpeculativeDecoder
    from draftheads.inference.default_tree import resolve_tree
    from draftheads.registry import method_of

    heads = dh.load_heads(heads_dir, target=target)
    tree = None
    if chain and method_of(heads).tree.rank_paths:  # EAGLE's dynamic trees keep their saved settings
        depth = heads.config.num_heads
        tree = [[0] * d for d in range(1, depth + 1)]
    source = heads
    if vocab is not None:  # one proposer drafting from that vocabulary, with the saved tree unless --chain
        size = heads.config.vocab_size if vocab == "none" else int(vocab)
        source = heads.proposer(tree=tree if tree is not None else resolve_tree(heads, target.device), draft_vocab_size=size)
    # batch_plan=None: the drafter is profiled even where the heads' plan would decode plain.
    # prompt_lookup=False: the heads' own drafts and costs, not prompt lookup's where their plan puts it in front.
    decoder = SpeculativeDecoder(target, source, tree=tree if vocab is None else None, draft_budget=None, batch_plan=None,
                                 prompt_lookup=False)
    box = {"draft": 0.0}
    cls = type(decoder.proposer)  # the drafter the loop drafts through
    original = _timed_propose(cls, box)
    sample = temperature > 0
    totals = {"steps": 0, "new": 0, "decode": 0.0, "verify": 0.0, "draft": 0.0, "plain": 0.0, "plain_new": 0}
    accepts: list[int] = []
    try:
        for i, ids in enumerate(prompts):
            gen_kwargs = dict(max_new_tokens=max_new, do_sample=sample, eos_token_id=[])
            if sample:
                gen_kwargs.update(temperature=temperature, top_k=0, top_p=1.0)
            for order in ((0, 1) if i % 2 == 0 else (1, 0)):
                if order == 0:
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        ref = target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=tokenizer.pad_token_id,
                                              **gen_kwargs)
                    totals["plain"] += time.perf_counter() - t0
                    totals["plain_new"] += ref.shape[1] - ids.shape[1]
                else:
                    box["draft"] = 0.0
                    out = decoder.generate(ids, max_new_tokens=max_new, temperature=temperature if sample else 0.0,
                                           top_k=0 if sample else None, top_p=1.0 if sample else None,
                                           eos_token_id=[], seed=seed + i)
                    totals["steps"] += out.stats["steps"]
                    totals["new"] += out.stats["new_tokens"]
                    totals["decode"] += out.decode_seconds
                    totals["verify"] += out.target_seconds
                    totals["draft"] += box["draft"]
                    accepts += out.accept_lengths
            if not sample and not torch.equal(out.sequences, ref.cpu()):
                raise AssertionError(f"{heads_dir}: greedy output differs from generate on prompt {i}")
    finally:
        cls.propose = original
    steps = max(1, totals["steps"])
    forward_ms = 1e3 * totals["plain"] / max(1, totals["plain_new"])
    deepest = max(accepts) - 1 if accepts else 0
    host = totals["decode"] - totals["draft"] - totals["verify"]
    return {
        "heads": heads_dir, "head_type": heads.head_type, "draft_vocab_size": vocab,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
        "tree_nodes": decoder.proposer.shape.size if hasattr(decoder.proposer, "shape") else None,
        "temperature": temperature, "steps": totals["steps"], "new_tokens": totals["new"],
        "accepted_per_step": totals["new"] / steps,
        "p_depth_accepted": [sum(a - 1 >= d for a in accepts) / max(1, len(accepts)) for d in range(1, deepest + 1)],
        "draft_ms": 1e3 * totals["draft"] / steps, "verify_ms": 1e3 * totals["verify"] / steps,
        "host_ms": 1e3 * host / steps, "step_ms": 1e3 * totals["decode"] / steps,
        "plain_ms_per_token": forward_ms,
        "draft_over_target_forward": 1e3 * totals["draft"] / steps / forward_ms,
        "speedup": (totals["plain"] / max(1, totals["plain_new"])) / (totals["decode"] / max(1, totals["new"])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser, num=12)
    parser.add_argument("--heads", action="append", default=[])
    parser.add_argument("--chain", action="store_true",
                        help="static-tree heads decode the chain of every trained depth, not the saved tree")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="folder for results-*.json")
    parser.add_argument("--draft-vocab-size", action="append", default=None,
                        help="repeatable: 'none' (whole vocabulary) or N (the N most frequent training tokens)")
    parser.add_argument("--verify-sizes", default=None, metavar="N,N,...",
                        help="also time one verify forward of each number of tree tokens (e.g. 1,2,4,8,16,32,64)")
    parser.add_argument("--verify-vs-bare", action="store_true",
                        help="with --verify-sizes: chains of those sizes through the verifier beside a bare forward")
    args = parser.parse_args()
    if not args.heads and not args.verify_sizes:
        parser.error("nothing to measure: pass --heads DIR (repeatable) and/or --verify-sizes")
    if args.verify_vs_bare and not args.verify_sizes:
        parser.error("--verify-vs-bare times chains of the --verify-sizes sizes: pass --verify-sizes too")
    torch.set_num_threads(args.threads)

    from draftheads.target import load_target

    target, tokenizer = load_target(args.target, device=torch.device("cpu"), dtype="float32")
    prompts = load_prompts(tokenizer, args.questions, args.num_prompts)
    results = []
    if args.verify_sizes:
        results.append(verify_costs(target, [int(n) for n in args.verify_sizes.split(",")],
                                    context=round(sum(p.shape[1] for p in prompts) / len(prompts))))
        print(json.dumps(results[-1]), flush=True)
        if args.verify_vs_bare:
            results.append(verify_vs_bare(target, sorted({1, *(int(n) for n in args.verify_sizes.split(","))}),
                                          context=results[-1]["context"]))
            print(json.dumps(results[-1]), flush=True)
    with torch.no_grad():  # warm-up
        target.generate(prompts[0], max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(prompts[0]))
    for heads_dir in args.heads:
        for vocab in args.draft_vocab_size or [None]:
            r = profile(target, tokenizer, heads_dir, prompts, args.max_new_tokens, args.temperature, args.chain,
                        args.seed, vocab)
            results.append(r)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else [round(x, 3) if isinstance(x, float) else x for x in v]
                                  if isinstance(v, list) else v) for k, v in r.items()}), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        vocabs = "-v" + "-".join(args.draft_vocab_size) if args.draft_vocab_size else ""
        name = f"results-t{args.temperature:g}{'-chain' if args.chain else ''}{vocabs}.json"
        (Path(args.out) / name).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
