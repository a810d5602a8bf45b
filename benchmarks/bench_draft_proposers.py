"""Draft-model and prompt-lookup decoding, side by side with transformers' own versions.

    python benchmarks/bench_draft_proposers.py --draft ~/.cache/draftheads/demo-draft-128x2 \\
        [--target demo] [--prompt-set code|repeat] [--num-prompts 12] [--gammas 1,2,3,4,5,6,7,8] [--out DIR]
    python benchmarks/bench_draft_proposers.py --draft PATH --random-draft      # the draft's config, random weights
    python benchmarks/bench_draft_proposers.py            # tiny random models: a smoke run of the script

Methods (greedy, one prompt at a time, same prompts for every method):
    hf-greedy          target.generate(do_sample=False)                 the baseline
    hf-assisted        target.generate(assistant_model=draft)           transformers' speculative decoding
    hf-prompt-lookup   target.generate(prompt_lookup_num_tokens=10)
    dh-draft-gK        SpeculativeDecoder(target, DraftModelProposer(draft, gamma=K)) for K in --gammas
                       (K = 0: plain decoding through our loop, the draft never runs)
    dh-draft-auto      ... gamma="auto": up to 8 drafts, capped each step by the decoder's draft budget
    dh-prompt-lookup   SpeculativeDecoder(target, PromptLookupProposer(max_ngram=3, num_tokens=10))

Prompt sets (--prompt-set): ``code`` = the first --prompt-tokens tokens of the demo corpus'
held-out files (as in `draftheads bench`); ``repeat`` = a repetitive-text task from the same files:
the first lines of a file (at most 240 characters) written three times, then the first line again,
so the natural continuation copies the block (high acceptance for any drafter that can copy).
``--prompts FILE`` reads prompts separated by blank lines instead.

Per prompt, every method runs once in a rotated order (prompt i starts at method i), after one
warm-up of each; --rounds > 1 repeats that and takes each method's per-prompt median. The speedup
of a method on a prompt is hf-greedy's time / its time on that prompt; reported: median and spread
(min / q1 / q3 / max) of these per-prompt speedups, the speedup over all prompts together
(hf-greedy's total time / the method's: what a user decoding this whole set would see, and
less sensitive than the median when prompts split into easy and hard groups, as the code set
does: some prompts accept 8 drafts, others 1), tokens/s (median over prompts), new tokens per
target forward (a forward hook counts the target's calls, prefill included, the same way for every
method) and whether the tokens equal hf-greedy's (they must for every method: all are exact).
Ratios in one interleaved run are what to compare; absolute numbers follow the machine's load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import draftheads as dh


def quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "min": min(values), "q1": q[0], "q3": q[2], "max": max(values)}


def tiny(seed: int, hidden: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(
        "llama", vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(cfg).eval()


def repeat_prompt(text: str, max_chars: int = 240) -> str:
    """A block of the file's first non-empty lines, three times, then its first line again."""
    lines, size = [], 0
    for line in (ln for ln in text.splitlines() if ln.strip()):
        if lines and size + len(line) + 1 > max_chars:
            break
        lines.append(line[:max_chars])
        size += len(line) + 1
    block = "\n".join(lines) + "\n"
    return block * 3 + lines[0] + "\n"


def load_prompts(args, tok) -> tuple[list[torch.Tensor], str]:
    if args.prompts:
        texts = [t for t in Path(args.prompts).read_text().split("\n\n") if t.strip()][: args.num_prompts]
        return [tok(t, return_tensors="pt").input_ids for t in texts], f"file {args.prompts}"
    from draftheads.demo import corpus_texts

    files = [t for t in corpus_texts("heldout") if len(t) > 2000][: args.num_prompts]
    if args.prompt_set == "code":
        prompts = [tok(t, return_tensors="pt").input_ids[:, : args.prompt_tokens] for t in files]
        return prompts, f"code: first {args.prompt_tokens} tokens of {len(files)} held-out files"
    prompts = [tok(repeat_prompt(t), return_tensors="pt").input_ids for t in files]
    return prompts, f"repeat: a <=240-character block of each of {len(files)} held-out files x3 + its first line"


def load(args):
    device = torch.device(args.device)
    if args.draft is None:
        target, draft = tiny(0, 256, 6), tiny(1, 64, 1)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, 256, (1, 32), generator=g) for _ in range(args.num_prompts)]
        return target.to(device), draft.to(device), prompts, None, "random token ids (tiny random models)"
    from draftheads.demo import resolve_target

    dtype = getattr(torch, args.dtype)
    path = resolve_target(args.target)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    if args.random_draft:
        torch.manual_seed(0)
        draft = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.draft), dtype=dtype)
    else:
        draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype)
    draft = draft.to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    dh.check_same_tokenizer(tok, AutoTokenizer.from_pretrained(args.draft))
    prompts, described = load_prompts(args, tok)
    return target, draft, prompts, tok, described


class ForwardCounter:
    """Counts the target's forward calls (a hook), to report tokens per target forward for every method."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.calls += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="demo", help="path, hub id or 'demo' (the cached demo target)")
    ap.add_argument("--draft", help="draft model folder (omit for a smoke run on tiny random models)")
    ap.add_argument("--random-draft", action="store_true", help="the draft's config with random weights (a useless draft)")
    ap.add_argument("--prompt-set", choices=["code", "repeat"], default="code")
    ap.add_argument("--prompts", help="text file, prompts separated by blank lines (instead of --prompt-set)")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length for --prompt-set code")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gammas", default="1,2,3,4,5,6,7,8", help="fixed draft lengths ('' for none)")
    ap.add_argument("--methods", default=None, help="comma-separated subset of method names (default: all)")
    ap.add_argument("--rounds", type=int, default=1, help="timed runs per prompt and method (median taken)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    ap.add_argument("--out", default=None, help="folder for results.json and results.md")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.random_draft and args.draft is None:
        ap.error("--random-draft needs --draft (whose config it uses)")
    target, draft, prompts, tok, described = load(args)
    device = target.device
    pad = getattr(tok, "pad_token_id", None)
    pad = pad if pad is not None else (target.config.eos_token_id or 0)
    n = args.max_new_tokens
    counter = ForwardCounter(target)

    def hf(**extra):
        def run(ids):
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                pad_token_id=pad, eos_token_id=None, **extra,
            )
            return out, None
        return run

    decoders: dict[str, dh.SpeculativeDecoder] = {}

    def ours(name, proposer, draft_budget="auto"):
        decoders[name] = decoder = dh.SpeculativeDecoder(target, proposer, draft_budget=draft_budget)

        def run(ids):
            out = decoder.generate(ids, max_new_tokens=n, temperature=0.0, eos_token_id=[])
            return out.sequences, out
        return run

    methods = {
        "hf-greedy": hf(),
        "hf-assisted": hf(assistant_model=draft),
        "hf-prompt-lookup": hf(prompt_lookup_num_tokens=10),
    }
    for k in (int(g) for g in args.gammas.split(",") if g.strip()):
        # draft_budget=None: a fixed length every step (the decoder's budget would cap it)
        methods[f"dh-draft-g{k}"] = ours(f"dh-draft-g{k}", dh.DraftModelProposer(draft, gamma=k), draft_budget=None)
    methods["dh-draft-auto"] = ours("dh-draft-auto", dh.DraftModelProposer(draft, gamma="auto"))
    methods["dh-prompt-lookup"] = ours("dh-prompt-lookup", dh.PromptLookupProposer(max_ngram=3, num_tokens=10))
    if args.methods:
        keep = ["hf-greedy", *[m for m in args.methods.split(",") if m != "hf-greedy"]]
        unknown = [m for m in keep if m not in methods]
        if unknown:
            ap.error(f"unknown methods {unknown}; known: {list(methods)}")
        methods = {m: methods[m] for m in keep}
    names = list(methods)

    prompts = [p.to(device) for p in prompts]
    for run in methods.values():  # warm-up (kernels, allocator, the adaptive draft's first estimates)
        run(prompts[0])
    per_prompt: dict[str, list[dict]] = {name: [] for name in names}
    started = time.perf_counter()
    for i, ids in enumerate(prompts):
        order = names[i % len(names) :] + names[: i % len(names)]  # rotate: no method always runs first
        times: dict[str, list[float]] = {name: [] for name in names}
        info: dict[str, dict] = {}
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                calls = counter.calls
                t0 = time.perf_counter()
                seqs, out = methods[name](ids)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
                new = seqs[0, ids.shape[1] :].cpu()
                info[name] = {"new": new, "forwards": counter.calls - calls, "out": out}
        reference = info["hf-greedy"]["new"]
        base = statistics.median(times["hf-greedy"])
        for name in names:
            seconds = statistics.median(times[name])
            row = {
                "prompt": i,
                "prompt_tokens": ids.shape[1],
                "seconds": seconds,
                "new_tokens": info[name]["new"].numel(),
                "tokens_per_second": info[name]["new"].numel() / seconds,
                "speedup": base / seconds,
                "tokens_per_forward": info[name]["new"].numel() / max(info[name]["forwards"], 1),
                "same_as_greedy": bool(torch.equal(info[name]["new"], reference)),
            }
            out = info[name]["out"]
            if out is not None:
                row["mean_accept_length"] = out.mean_accept_length
                row["stats"] = {k: v for k, v in out.stats.items() if isinstance(v, (int, float, str, dict, list))}
            per_prompt[name].append(row)
        print(f"prompt {i + 1}/{len(prompts)} ({ids.shape[1]} tokens): "
              + " ".join(f"{name}={per_prompt[name][-1]['speedup']:.2f}" for name in names[1:]), flush=True)
    elapsed = time.perf_counter() - started

    summary = {}
    for name in names:
        rows = per_prompt[name]
        entry = {
            "speedup": quantiles([r["speedup"] for r in rows]),
            "tokens_per_second": statistics.median(r["tokens_per_second"] for r in rows),
            # all prompts together: hf-greedy's total time / this method's (= ratio of overall tokens/s)
            "speedup_total": sum(r["seconds"] for r in per_prompt["hf-greedy"]) / sum(r["seconds"] for r in rows),
            "tokens_per_forward": sum(r["new_tokens"] for r in rows) / sum(r["new_tokens"] / r["tokens_per_forward"] for r in rows),
            "same_as_greedy": f"{sum(r['same_as_greedy'] for r in rows)}/{len(rows)}",
        }
        if "mean_accept_length" in rows[0]:
            entry["mean_accept_length"] = statistics.mean(r["mean_accept_length"] for r in rows)
        if name == "dh-draft-auto":
            hist: dict[int, int] = {}
            for r in rows:
                for g, c in r["stats"]["gamma_histogram"].items():
                    hist[int(g)] = hist.get(int(g), 0) + c
            steps = {mode: sum(r["stats"]["draft_budget"]["steps"][mode] for r in rows)
                     for mode in ("full", "capped", "plain")}
            entry["auto"] = {"gamma_histogram": dict(sorted(hist.items())), "budget_steps": steps,
                             "reach_at_end": rows[-1]["stats"]["draft_budget"].get("reach")}
        summary[name] = entry

    fixed = [m for m in names if m.startswith("dh-draft-g") and m != "dh-draft-g0"]  # g0 = plain, our loop
    lines = [
        f"Prompts: {described}; {n} new tokens, greedy; threads {torch.get_num_threads()}; "
        f"{len(prompts)} prompts x {args.rounds} round(s) in {elapsed:.0f} s",
        "",
        "| method | speedup vs hf-greedy, median | min / q1 / q3 / max | all prompts (total time) | tokens/s, median | tokens per target forward | same as greedy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        e = summary[name]
        s = e["speedup"]
        lines.append(
            f"| {name} | {s['median']:.2f}x | {s['min']:.2f} / {s['q1']:.2f} / {s['q3']:.2f} / {s['max']:.2f} | "
            f"{e['speedup_total']:.2f}x | {e['tokens_per_second']:.1f} | {e['tokens_per_forward']:.2f} | {e['same_as_greedy']} |"
        )
    if fixed and "dh-draft-auto" in summary:
        best = max(fixed, key=lambda m: summary[m]["speedup"]["median"])
        auto = summary["dh-draft-auto"]
        ratio = auto["speedup"]["median"] / summary[best]["speedup"]["median"]
        best_total = max(fixed, key=lambda m: summary[m]["speedup_total"])
        ratio_total = auto["speedup_total"] / summary[best_total]["speedup_total"]
        # Per prompt: auto's time against the best fixed gamma's time on that prompt (oracle per prompt).
        per = [min(per_prompt[m][i]["seconds"] for m in fixed) / per_prompt["dh-draft-auto"][i]["seconds"]
               for i in range(len(prompts))]
        lines += [
            "",
            f"gamma=\"auto\" (the draft budget): median speedup {auto['speedup']['median']:.2f}x vs the best fixed gamma ({best}, "
            f"{summary[best]['speedup']['median']:.2f}x): ratio {ratio:.3f}; against the best fixed gamma of each "
            f"prompt: median {statistics.median(per):.3f} (min {min(per):.3f}).",
            f"All prompts together (total time): auto {auto['speedup_total']:.3f}x vs the best fixed gamma "
            f"({best_total}, {summary[best_total]['speedup_total']:.3f}x): ratio {ratio_total:.3f}.",
            f"Auto: {json.dumps(auto['auto'])}",
        ]
    for a, b in (("dh-prompt-lookup", "hf-prompt-lookup"), ("dh-draft-auto", "hf-assisted")):
        if a in summary and b in summary:
            per = [per_prompt[b][i]["seconds"] / per_prompt[a][i]["seconds"] for i in range(len(prompts))]
            lines.append(f"{a} vs {b}: per-prompt time ratio median {statistics.median(per):.3f} "
                         f"(min {min(per):.3f}, max {max(per):.3f}); >1 = ours faster")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {
            "args": vars(args), "prompts": described, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
            "elapsed_seconds": elapsed,
        }
        (out / "results.json").write_text(json.dumps({"meta": meta, "summary": summary, "per_prompt": per_prompt}, indent=1, default=str))
        (out / "results.md").write_text(text + "\n")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
