"""Dynamic cache vs static cache vs static cache + torch.compile of the verify forward, batch 1.

    python benchmarks/static_compile.py --heads DIR [--target demo] [--prompts 4] [--max-new-tokens 128]
        [--rounds 3] [--backend inductor] [--methods generate,medusa/dynamic,...] [--out DIR]

One process, so compiled graphs are reused: every method first decodes every prompt once (warm-up:
compilation happens there, its time is reported separately as the warm-up's excess over the
method's steady time on the same prompt), then `--rounds` timed rounds decode every prompt with
every method, the method order rotating per round (interleaved: all methods see the same load).
Reported per method: per-prompt tokens/s (new tokens / wall time of the whole call, prefill
included, as for `generate`), median and min-max over prompts x rounds, the median ratio to the
dynamic cache, and whether every output equals plain greedy `generate` (exactness checked on every
call). Graphs compiled during the timed rounds (a tree size not seen in the warm-up) are counted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

import draftheads as dh  # noqa: E402
from draftheads.atomic import write_text_atomically  # noqa: E402
from draftheads.inference import PromptLookupProposer  # noqa: E402

ALL_METHODS = ("generate", "medusa/dynamic", "medusa/static", "medusa/static+compile",
               "lookup/dynamic", "lookup/static", "lookup/static+compile")


def graphs_compiled() -> int:
    import torch._dynamo.utils

    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def make_methods(target, heads, names: list[str], backend: str) -> dict:
    """name -> callable(ids, max_new) returning the sequences; decoders built once (their compiled
    graphs and static caches persist across calls, as in a server)."""
    def speculative(proposer_kind: str, cache: str, compile_: bool):
        proposer = heads if proposer_kind == "medusa" else PromptLookupProposer()
        decoder = dh.SpeculativeDecoder(target, proposer, cache=cache, compile=backend if compile_ else False)
        return lambda ids, n: decoder.generate(ids, max_new_tokens=n).sequences

    methods = {}
    for name in names:
        if name == "generate":
            methods[name] = lambda ids, n: target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                                           max_new_tokens=n)
        else:
            kind, variant = name.split("/")
            methods[name] = speculative(kind, "static" if variant.startswith("static") else "dynamic",
                                        variant.endswith("compile"))
    return methods


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="demo")
    ap.add_argument("--heads", required=True, help="Medusa heads folder for the target")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backend", default="inductor", help="torch.compile backend of the +compile methods")
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "benchmarks" / "measurements" / "static-compile")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftheads.demo import corpus_texts, resolve_target

    torch.set_num_threads(args.threads)
    path = resolve_target(args.target)
    tok = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    heads = dh.load_heads(args.heads, target=target)
    texts = [t for t in corpus_texts("heldout") if len(t) > 2000][: args.prompts]
    prompts = [torch.tensor([tok(t).input_ids[: args.prompt_tokens]]) for t in texts]
    names = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(names) - set(ALL_METHODS))
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; known: {', '.join(ALL_METHODS)}")
    methods = make_methods(target, heads, names, args.backend)

    with torch.inference_mode():
        references = [target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=args.max_new_tokens) for ids in prompts]
    exact = {name: True for name in names}
    warmup = {name: [] for name in names}
    graphs_warmup = {}
    for name in names:
        before = graphs_compiled()
        for ids, ref in zip(prompts, references):
            t0 = time.perf_counter()
            out = methods[name](ids, args.max_new_tokens)
            warmup[name].append(time.perf_counter() - t0)
            exact[name] &= torch.equal(out, ref)
        graphs_warmup[name] = graphs_compiled() - before
        print(f"warm-up {name}: {sum(warmup[name]):.1f}s, {graphs_warmup[name]} graphs", flush=True)

    seconds = {name: [[] for _ in prompts] for name in names}
    tps = {name: [] for name in names}
    graphs_before = graphs_compiled()
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for p, (ids, ref) in enumerate(zip(prompts, references)):
            new = ref.shape[1] - ids.shape[1]
            for name in order:
                t0 = time.perf_counter()
                out = methods[name](ids, args.max_new_tokens)
                dt = time.perf_counter() - t0
                exact[name] &= torch.equal(out, ref)
                seconds[name][p].append(dt)
                tps[name].append(new / dt)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{n} {statistics.median(tps[n]):.1f}" for n in names),
              flush=True)
    graphs_timed = graphs_compiled() - graphs_before

    rows = {}
    for name in names:
        steady = [statistics.median(s) for s in seconds[name]]
        rows[name] = {
            "tokens_per_s": spread(tps[name]),
            "exact": exact[name],
            "warmup_excess_s": sum(w - s for w, s in zip(warmup[name], steady)),
            "graphs_compiled_in_warmup": graphs_warmup[name],
        }
    for name in names:  # per-call ratio to the same proposer's dynamic cache (same prompt, same round)
        base = name.split("/")[0] + "/dynamic"
        if "/" in name and base in names and name != base:
            ratios = [b / a for sa, sb in zip(seconds[name], seconds[base]) for a, b in zip(sa, sb)]
            rows[name]["speed_vs_dynamic"] = spread(ratios)
        if "generate" in names and name != "generate":
            ratios = [b / a for sa, sb in zip(seconds[name], seconds["generate"]) for a, b in zip(sa, sb)]
            rows[name]["speed_vs_generate"] = spread(ratios)
    result = {
        "target": str(path), "heads": str(args.heads), "backend": args.backend, "prompts": len(prompts),
        "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
        "threads": args.threads, "torch": torch.__version__, "graphs_compiled_in_timed_rounds": graphs_timed,
        "methods": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_text_atomically(args.out / "results.json", json.dumps(result, indent=2) + "\n")
    write_text_atomically(args.out / "report.md", report(result))
    print(report(result))


def ratio(r: dict | None, spread_too: bool = True) -> str:
    if r is None:
        return "-"
    return f"{r['median']:.2f}x" + (f" ({r['min']:.2f}-{r['max']:.2f})" if spread_too else "")


def report(result: dict) -> str:
    lines = [
        "# Static cache and torch.compile of the verify forward (batch 1)",
        "",
        f"Target {result['target']}, {result['prompts']} prompts of {result['prompt_tokens']} tokens, "
        f"{result['max_new_tokens']} new tokens, {result['rounds']} interleaved rounds, {result['threads']} thread(s), "
        f"compile backend {result['backend']}, torch {result['torch']}. Tokens/s = new tokens / wall time of the call.",
        "",
        "| method | tokens/s median (min-max) | vs dynamic, median (min-max) | vs generate, median | exact | "
        "warm-up excess (compile) s | graphs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in result["methods"].items():
        t = row["tokens_per_s"]
        lines.append(
            f"| {name} | {t['median']:.1f} ({t['min']:.1f}-{t['max']:.1f}) | {ratio(row.get('speed_vs_dynamic'))} | "
            f"{ratio(row.get('speed_vs_generate'), spread_too=False)} | {row['exact']} | "
            f"{row['warmup_excess_s']:.1f} | {row['graphs_compiled_in_warmup']} |"
        )
    lines += ["", f"Graphs compiled during the timed rounds: {result['graphs_compiled_in_timed_rounds']} "
              "(0 = every tree size was compiled in the warm-up).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
