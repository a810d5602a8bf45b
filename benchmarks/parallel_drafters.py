"""The parallel drafters side by side at one training budget: held-out acceptance by draft position,
tokens per step for a chain and for the best tree, and (``--timing``) wall-clock ratios on this CPU.

    python benchmarks/parallel_drafters.py --heads dflash=runs/smollm2-dflash/heads \\
        --heads dspark=runs/smollm2-dspark/heads --heads dflash2=runs/smollm2-dflash2/heads \\
        --heads peagle=runs/smollm2-peagle/heads --heads eagle3=runs/smollm2-eagle3/heads \\
        [--questions unused:configs/smollm2.yaml] [--tune-prompts 8] [--num-prompts 24] [--new-tokens 96] \\
        [--max-nodes 16] [--timing] --out results/parallel-drafters

Prompts: the first user turns of chats none of the heads trained on (``unused:CONFIG``, as
benchmarks/acceptance_gap.py takes them), the first ``--tune-prompts`` for choosing each tree, the
next ``--num-prompts`` for measuring. Every decode is greedy, checked equal to ``target.generate``,
with the heads alone (no prompt lookup, ``draft_budget=None``: the full draft every step, so the
figures follow the heads, not the machine's load):

- the chain: each head type's whole draft (a block's K slots; P-EAGLE's trained depths; EAGLE-3's
  trained steps as a top-1 dynamic tree). Reported: mean tokens committed per step, and per draft
  position j the share of steps accepting at least j drafts (steps near the end of an answer, whose
  depth ``max_new_tokens`` cut, are left out of the positions they could not reach);
- the best tree of at most ``--max-nodes`` nodes, chosen hardware-independently: for the heads that
  draft every depth in one forward, the best-first tree of the per-depth, per-rank acceptance table
  measured on the tune prompts (DSpark and DFlash2: conditioned on the true previous token, the
  only parent a node is accepted under), i.e. the most expected tokens per step; for EAGLE-3, the
  EAGLE-2 setting of that many tokens with the most tokens per step on the tune prompts.

``--timing`` (run it under the exclusive CPU lock): per measured prompt, plain decoding (the
target's own ``generate``) and every drafter's chain and tree, interleaved, timed; the ratio is the
plain seconds over the drafter's for the same answer, reported as the median and range over
prompts. DSpark's chain is also timed under the online draft budget with and without its confidence
estimates (``OnlineDraftBudget(use_estimates=...)``): whether the confidence head's verify width beats
the budget's own estimate, and the fixed block.

Writes DIR/results.json and DIR/summary.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from acceptance_gap import unused_chats  # noqa: E402
from prompts import DEFAULT_TARGET, load_prompts  # noqa: E402


def chain_and_depth(heads) -> tuple[object, int]:
    """The head type's whole draft as a chain, and its depth."""
    from draftheads.registry import TreeKind, method_of

    k = heads.config.num_heads
    if method_of(heads).tree is TreeKind.DYNAMIC:
        return {"total_tokens": k + 1, "depth": k, "top_k": 1}, k
    return [[0] * d for d in range(1, k + 1)], k


def best_tree(target, heads, tune_seqs, skip, max_nodes: int, prompts, references, new_tokens: int):
    """The best tree of at most ``max_nodes`` nodes (module docstring) and what was measured to choose it."""
    from draftheads.heads.acceptance import grow_tree
    from draftheads.inference.one_forward_tree import one_forward_accuracy
    from draftheads.registry import TreeKind, method_of

    kind = method_of(heads).tree
    if kind is TreeKind.ONE_FORWARD:
        table = one_forward_accuracy(target, heads, tune_seqs, max_rank=8, skip_prompt=skip)
        grown = grow_tree(table, max_nodes - 1)
        return [list(p) for p, _ in grown], {"expected_tokens": 1.0 + sum(v for _, v in grown),
                                            "table": [[round(float(x), 4) for x in row] for row in table]}
    grid = [{"total_tokens": max_nodes, "depth": d, "top_k": k} for d in (4, 6) for k in (2, 4)]
    scored = []
    for setting in grid:
        stats = decode(target, heads, setting, prompts, references, new_tokens, 0)
        scored.append((stats["tokens_per_step"], setting))
    best = max(scored, key=lambda s: s[0])
    return best[1], {"grid": [{"setting": s, "tokens_per_step": round(v, 4)} for v, s in scored]}


def decode(target, heads, tree, prompts, references, new_tokens: int, depth: int) -> dict:
    """Greedy decodes of ``prompts`` with ``tree``, checked against ``references``: tokens per step
    and the share of steps accepting at least j drafts, j = 1..depth (steps that could draft j deep)."""
    from draftheads import SpeculativeDecoder

    decoder = SpeculativeDecoder(target, heads, tree=tree, draft_budget=None, prompt_lookup=False)
    lengths, per_prompt, reach, could = [], [], [0] * depth, [0] * depth
    for ids, ref in zip(prompts, references):
        out = decoder.generate(ids, max_new_tokens=new_tokens)
        if not torch.equal(out.sequences.cpu(), ref):
            raise AssertionError("a speculative decode differs from target.generate")
        per_prompt.append(sum(out.accept_lengths) / len(out.accept_lengths))
        emitted = 1  # the prefill's token
        total = ref.shape[1] - ids.shape[1]
        for n in out.accept_lengths:
            limit = min(depth, new_tokens - emitted - 1)
            for j in range(1, depth + 1):
                if j <= limit:
                    could[j - 1] += 1
                    reach[j - 1] += n - 1 >= j
            emitted += n
            lengths.append(n)
        assert emitted >= total
    return {"tokens_per_step": sum(lengths) / len(lengths), "steps": len(lengths),
            "reach": [r / max(c, 1) for r, c in zip(reach, could)], "per_prompt": spread(per_prompt)}


def spread(values: list[float]) -> dict:
    """Median and quartiles over prompts: the mean over all steps alone hides whether a drafter
    helps every answer a little or a few answers a lot."""
    from draftheads.bench.metrics import spread as summary

    return {**summary(values), "values": values}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timing(target, loaded, trees, prompts, new_tokens: int) -> dict:
    """Plain vs every drafter's chain and tree (and DSpark's budgets), interleaved per prompt."""
    from draftheads import SpeculativeDecoder
    from draftheads.inference.draft_budget import OnlineDraftBudget

    decoders = {}
    for name, heads in loaded.items():
        chain, _ = chain_and_depth(heads)
        decoders[f"{name}-chain"] = SpeculativeDecoder(target, heads, tree=chain, draft_budget=None, prompt_lookup=False)
        decoders[f"{name}-tree"] = SpeculativeDecoder(target, heads, tree=trees[name], draft_budget=None, prompt_lookup=False)
        if getattr(heads, "confidence_head", None) is not None:
            for label, use in (("budget-own", False), ("budget-confidence", True)):
                decoders[f"{name}-chain-{label}"] = SpeculativeDecoder(
                    target, heads, tree=chain, draft_budget=OnlineDraftBudget(use_estimates=use), prompt_lookup=False)
    ratios = {name: [] for name in decoders}
    stats = {name: {"tokens_per_step": [], "verify_tokens": []} for name in decoders}

    def plain(ids):
        target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens)

    for ids in prompts[:2]:  # warm-up, untimed
        plain(ids)
        for d in decoders.values():
            d.generate(ids, max_new_tokens=new_tokens)
    for ids in prompts:
        base = timed(lambda: plain(ids))
        for name, d in decoders.items():
            holder = {}
            seconds = timed(lambda: holder.setdefault("out", d.generate(ids, max_new_tokens=new_tokens)))
            out = holder["out"]
            ratios[name].append(base / seconds)
            stats[name]["tokens_per_step"].append(sum(out.accept_lengths) / len(out.accept_lengths))
            stats[name]["verify_tokens"].append(out.stats.get("verify_tokens"))
    return {name: {"median": statistics.median(v), "min": min(v), "max": max(v),
                   "tokens_per_step": statistics.mean(stats[name]["tokens_per_step"])} for name, v in ratios.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", action="append", required=True, help="NAME=PATH, repeatable")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--questions", default="unused:configs/smollm2.yaml")
    p.add_argument("--tune-prompts", type=int, default=8)
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--max-nodes", type=int, default=16)
    p.add_argument("--timing", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.device import cpu_name
    from draftheads.target import load_target

    target, tokenizer = load_target(args.target, device=torch.device("cpu"), dtype="float32")
    with tempfile.TemporaryDirectory() as tmp:
        source = unused_chats(args.questions.split(":", 1)[1], Path(tmp)) if args.questions.startswith("unused:") \
            else args.questions
        prompts = load_prompts(tokenizer, source, args.tune_prompts + args.num_prompts)
    tune, measure = prompts[: args.tune_prompts], prompts[args.tune_prompts :]
    with torch.no_grad():
        def greedy(ids):
            return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=args.new_tokens)
        tune_refs = [greedy(ids) for ids in tune]
        refs = [greedy(ids) for ids in measure]
    results = {"command": " ".join(sys.argv), "cpu": cpu_name(), "new_tokens": args.new_tokens,
               "tune_prompts": len(tune), "prompts": len(measure), "max_nodes": args.max_nodes, "heads": {}}
    loaded, trees = {}, {}
    for spec in args.heads:
        name, path = spec.split("=", 1)
        heads = dh.load_heads(path, target=target)
        loaded[name] = heads
        chain, depth = chain_and_depth(heads)
        tree, chosen = best_tree(target, heads, [r[0] for r in tune_refs], [ids.shape[1] for ids in tune],
                                 args.max_nodes, tune, tune_refs, args.new_tokens)
        trees[name] = tree
        chain_stats = decode(target, heads, chain, measure, refs, args.new_tokens, depth)
        tree_stats = decode(target, heads, tree, measure, refs, args.new_tokens, 0)
        results["heads"][name] = {"path": path, "head_type": heads.config.head_type, "depth": depth,
                                  "chain": chain_stats, "tree": {**tree_stats, "tree": tree, **chosen}}
        print(f"{name}: chain {chain_stats['tokens_per_step']:.3f} tokens/step, reach "
              f"{'/'.join(f'{x:.3f}' for x in chain_stats['reach'])}; tree {tree_stats['tokens_per_step']:.3f}", flush=True)
    if args.timing:
        results["timing"] = timing(target, loaded, trees, measure, args.new_tokens)
        for name, t in results["timing"].items():
            print(f"{name}: {t['median']:.2f}x plain ({t['min']:.2f}-{t['max']:.2f}), {t['tokens_per_step']:.2f} tokens/step",
                  flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "summary.md").write_text(summary(results))


def with_spread(stats: dict) -> str:
    """``1.239 [1.21, 1.17-1.30]``: the mean over steps, then the per-prompt median and quartiles
    (results.json files written before the spread was kept show the mean alone)."""
    s = stats.get("per_prompt")
    mean = f"{stats['tokens_per_step']:.3f}"
    return mean if s is None else f"{mean} [{s['median']:.2f}, {s['q1']:.2f}-{s['q3']:.2f}]"


def summary(results: dict) -> str:
    heads = results["heads"]
    depth = max(h["depth"] for h in heads.values())
    lines = [f"`{results['command']}`", "",
             f"{results['prompts']} held-out prompts (first user turns of chats no heads trained on), {results['new_tokens']} "
             f"new tokens each, greedy, every output equal to target.generate; trees of at most {results['max_nodes']} "
             f"nodes chosen on {results['tune_prompts']} other prompts.", "",
             "Tokens per step: over all steps, then in brackets the per-prompt median and quartiles.", "",
             "| heads | chain tokens/step | " + " | ".join(f"reach {j}" for j in range(1, depth + 1))
             + " | best tree tokens/step |",
             "|---|---:|" + "---:|" * depth + "---:|"]
    for name, h in heads.items():
        reach = [f"{x:.3f}" for x in h["chain"]["reach"]] + ["-"] * (depth - h["depth"])
        lines.append(f"| {name} | {with_spread(h['chain'])} | " + " | ".join(reach)
                     + f" | {with_spread(h['tree'])} |")
    if "timing" in results:
        lines += ["", f"Wall clock on {results['cpu']}: plain seconds / drafter seconds per prompt, median (range), "
                      "interleaved per prompt.", "", "| decoder | ratio | tokens/step |", "|---|---:|---:|"]
        for name, t in results["timing"].items():
            lines.append(f"| {name} | {t['median']:.2f}x ({t['min']:.2f}-{t['max']:.2f}) | {t['tokens_per_step']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
