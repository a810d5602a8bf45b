"""vLLM (its CPU build) serving the target: plain, vLLM's own n-gram drafting, and draftheads-trained
heads exported to it, at several numbers of concurrent requests.

    python benchmarks/bench_vllm_serving.py --heads medusa=runs/smollm2-medusa/heads eagle3=runs/smollm2/heads \\
        [--questions mt-bench] --out results/vllm-serving
        [--target smollm2] [--concurrency 1,4,16] [--num-prompts 16] [--prompts-at-c1 N] [--max-tokens 128] [--k 3]
        [--rounds 2]

What runs: the first turns of --questions, chat-templated as `draftheads bench` renders them
(benchmarks/prompts.py), greedy, fp32, ``ignore_eos``, --max-tokens new tokens
each. Every heads folder is exported with ``export_heads(..., "vllm")`` (Medusa -> MedusaModel,
EAGLE -> vLLM's EAGLE-1 layout, EAGLE-3 -> the speculators format) and drafts --k tokens per step;
n-gram is ``{"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 1}`` with the same k.
Concurrency c = the prompts go to ``LLM.generate`` c at a time, so every concurrency level decodes
the same prompts and the same tokens (``--prompts-at-c1 N``: concurrency 1, the slowest level,
decodes only the first N). Engines run in the vLLM venv's python (tests/engines/vllm_runner.py), one vLLM process per
round, one engine at a time; a round builds each engine once and runs every concurrency level on
it; rounds rotate the engine order (n-gram always last, see `run_vllm`), and each engine's speedup
is taken against plain in the same round (close in time on a machine whose load drifts), median over rounds.

Reported (results.json, results.md): tokens/s per engine and concurrency (median over rounds),
speedup over plain vLLM, whether every output equals plain vLLM's, vLLM's accepted tokens per draft
position and the mean tokens per step; and the acceptance comparison: draftheads' own chain decoding
of the same heads on the same prompts, counted the way vLLM counts (tests/engines/vllm_counting.py),
next to vLLM's counters at each concurrency. Equal counts say the export lost nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from vllm_common import (REPO, add_arguments, cpu_name, engines_module, finish_arguments, level_prompts,
                         speculative_config, target_prompts)

RUNNER = REPO / "tests" / "engines" / "vllm_runner.py"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, max_tokens=128, rounds=2)
    p.add_argument("--exports", help="folder for the exported heads (default: OUT/exports)")
    return finish_arguments(p, p.parse_args(argv), reserved=("plain", "ngram"))


def engine_configs(args, exports: dict[str, Path]) -> dict[str, dict | None]:
    configs: dict[str, dict | None] = {
        "plain": None,
        "ngram": {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
    }
    for name, folder in exports.items():
        configs[name] = speculative_config(args.heads[name][1], folder, args.k)
    return configs


def run_vllm(args, target_dir: str, prompts, configs, out: Path) -> dict:
    """One vLLM process per round. In vLLM 0.32.0 (CPU) an engine built after an n-gram engine in the
    same process fails in ``register_triton_kernel_overrides`` (``AttributeError: '_lib_fn_wrapper'
    object has no attribute 'get'``), so n-gram goes last in each round; the others rotate."""
    names = [n for n in configs if n != "ngram"]
    merged: dict = {"engines": {}}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)] + (["ngram"] if "ngram" in configs else [])
        spec = {
            "model": target_dir, "dtype": "float32", "max_num_seqs": max(args.concurrency),
            "max_model_len": args.prompt_tokens + args.max_tokens + args.k + 64, "warmup_tokens": 16,
            "engines": [{"name": f"{n}@{r}", "speculative_config": configs[n]} for n in order],
            "runs": [{"name": f"c{c}", "prompts": prompts[: level_prompts(args, c)], "max_tokens": args.max_tokens,
                      "batch_size": c} for c in args.concurrency],
        }
        spec_path, raw_path = out / f"vllm_spec_round{r}.json", out / f"vllm_raw_round{r}.json"
        spec_path.write_text(json.dumps(spec))
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        with open(out / f"vllm_log_round{r}.txt", "w") as log:
            proc = subprocess.run([args.vllm_python, str(RUNNER), "--spec", str(spec_path), "--out", str(raw_path)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise SystemExit(f"the vLLM runner failed (exit {proc.returncode}); see {out / f'vllm_log_round{r}.txt'}")
        raw = json.loads(raw_path.read_text())
        failed = {n: e["error"] for n, e in raw["engines"].items() if "error" in e}
        if failed:
            raise SystemExit("vLLM engines failed:\n" + "\n".join(f"{n}:\n{e}" for n, e in failed.items()))
        merged["vllm_version"] = raw["vllm_version"]
        merged["engines"].update(raw["engines"])
        print(f"round {r}: {', '.join(order)} done", file=sys.stderr, flush=True)
    return merged


def draftheads_acceptance(target, heads_dir: str, prompts, args, counting) -> dict:
    """draftheads' own chain decoding of the heads (k drafts a step, the whole vocabulary), counted as vLLM counts."""
    import draftheads as dh

    from draftheads.registry import method_of

    heads = dh.load_heads(heads_dir, target=target)
    chain = (dh.StaticTree.chain(args.k) if method_of(heads).tree.rank_paths
             else dh.DynamicTree(total_tokens=args.k + 1, depth=args.k, top_k=1))
    # Full drafts at every step, as vLLM runs them: no draft budget, no plan (heads whose plan
    # decodes plainly on this machine would otherwise never draft here), and no prompt lookup in
    # front of the heads where the plan puts it (vLLM drafts with the heads alone).
    decoder = dh.SpeculativeDecoder(target, heads, tree=chain, draft_budget=None, batch_plan=None, prompt_lookup=False)
    if getattr(decoder.proposer, "vocab_ids", None) is not None and heads.config.head_type != "eagle3":
        raise SystemExit(f"{heads_dir}: the proposer drafts from a reduced vocabulary; vLLM drafts from the whole one")
    per_prompt, t0 = [], time.perf_counter()
    for ids in prompts:
        row = torch.tensor([ids])  # the mask says every token counts: a chat prompt holds the pad id (<|im_end|>)
        out = decoder.generate(row, attention_mask=torch.ones_like(row),
                               max_new_tokens=counting.decode_budget(args.max_tokens, args.k), eos_token_id=[])
        per_prompt.append(counting.vllm_counts(out.accept_lengths, args.max_tokens, args.k))
    return {"per_prompt": per_prompt, "seconds": time.perf_counter() - t0}


def total(per_prompt, n: int) -> dict:
    """Counts over the first ``n`` prompts."""
    return {"num_drafts": sum(d for d, _ in per_prompt[:n]),
            "accepted_per_pos": [sum(col) for col in zip(*(pos for _, pos in per_prompt[:n]))]}


def summarise(args, raw: dict, configs: dict, prompts) -> dict:
    rows = {}
    for name in configs:
        rows[name] = {}
        for c in args.concurrency:
            total_tokens = level_prompts(args, c) * args.max_tokens
            runs = [raw["engines"][f"{name}@{r}"]["runs"][f"c{c}"] for r in range(args.rounds)]
            plain = [raw["engines"][f"plain@{r}"]["runs"][f"c{c}"] for r in range(args.rounds)]
            seconds = [run["seconds"][0] for run in runs]
            speedups = [p["seconds"][0] / s for p, s in zip(plain, seconds)]
            counters = runs[0]["counters"][0]
            drafts = counters["num_drafts"]
            rows[name][f"c{c}"] = {
                "tokens_per_s": [total_tokens / s for s in seconds],
                "tokens_per_s_median": statistics.median(total_tokens / s for s in seconds),
                "speedup_vs_plain": speedups,
                "speedup_vs_plain_median": statistics.median(speedups),
                "outputs_equal_plain": all(run["outputs"] == p["outputs"] for run, p in zip(runs, plain)),
                "counters": counters,
                "counters_same_every_round": all(run["counters"][0] == counters for run in runs),
                "acceptance_rate_per_pos": [a / drafts for a in counters["accepted_per_pos"]] if drafts else [],
                "tokens_per_step": 1 + counters["num_accepted_tokens"] / drafts if drafts else 1.0,
            }
    return rows


def fmt_rates(rates: list[float]) -> str:
    return " / ".join(f"{r:.3f}" for r in rates) if rates else "-"


def markdown(result: dict) -> str:
    a, env = result["args"], result["environment"]
    conc = a["concurrency"]
    lines = [
        f"# vLLM serving on {result['args']['target']}: plain vs n-gram vs draftheads heads", "",
        f"`{result['command']}`", "",
        f"vLLM {env['vllm']} (CPU build), {env['cpu']}, {env['cpu_count']} cores; load average "
        f"{env['loadavg_start'][0]:.1f} at the start, {env['loadavg_end'][0]:.1f} at the end (the machine is shared: "
        "absolute tokens/s follow its load, speedups are per round against plain in the same round).",
        f"{a['num_prompts']} prompts (concurrency 1: the first {a['prompts_at_c1'] or a['num_prompts']}) x "
        f"{a['max_tokens']} new tokens, greedy fp32, k = {a['k']} draft tokens, "
        f"{a['rounds']} rounds; concurrency c = c requests per `LLM.generate` call.", "",
        "## Throughput (tokens/s, median over rounds; speedup vs plain vLLM in the same round, median)", "",
        "| engine | " + " | ".join(f"c={c}" for c in conc) + " | output = plain |",
        "|---|" + "---|" * len(conc) + "---|",
    ]
    for name, row in result["engines"].items():
        cells = [f"{row[f'c{c}']['tokens_per_s_median']:.1f} ({row[f'c{c}']['speedup_vs_plain_median']:.2f}x)" for c in conc]
        equal = all(row[f"c{c}"]["outputs_equal_plain"] for c in conc)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if equal else 'NO'} |")
    lines += ["", "## Acceptance in vLLM (c=1): accepted per draft position / drafts, tokens per step", "",
              "| engine | drafts | acceptance per position | tokens per step |", "|---|---|---|---|"]
    for name, row in result["engines"].items():
        if name == "plain":
            continue
        r = row[f"c{conc[0]}"]
        lines.append(f"| {name} | {r['counters']['num_drafts']} | {fmt_rates(r['acceptance_rate_per_pos'])} | {r['tokens_per_step']:.2f} |")
    lines += ["", "## draftheads vs vLLM: the same heads, the same prompts, counted the same way", "",
              "Drafts and accepted tokens per draft position (draftheads' chain decoding / vLLM's counters).", "",
              "| heads | concurrency | prompts | draftheads | vLLM | equal |", "|---|---|---|---|---|---|"]
    for name, cmp in result["acceptance_comparison"].items():
        for level, v in cmp["levels"].items():
            lines.append(f"| {name} | {level[1:]} | {v['prompts']} | {v['draftheads']['num_drafts']}, "
                         f"{v['draftheads']['accepted_per_pos']} | {v['vllm']['num_drafts']}, {v['vllm']['accepted_per_pos']} | "
                         f"{'yes' if v['equal'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    from draftheads.target import resolve_target
    from draftheads.export import export_heads
    from transformers import AutoModelForCausalLM

    counting = engines_module("vllm_counting")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    target_dir = resolve_target(args.target)
    prompts = target_prompts(args, target_dir)
    exports = {
        name: export_heads(folder, Path(args.exports or out / "exports") / name, "vllm", verifier=target_dir,
                           num_speculative_tokens=args.k, overwrite=True)
        for name, (folder, _) in args.heads.items()
    }
    configs = engine_configs(args, exports)
    t0 = time.perf_counter()
    raw = run_vllm(args, target_dir, prompts, configs, out)
    vllm_seconds = time.perf_counter() - t0
    rows = summarise(args, raw, configs, prompts)

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    comparison = {}
    for name, (folder, _) in args.heads.items():
        ours = draftheads_acceptance(target, folder, prompts, args, counting)
        levels = {}
        for c in args.concurrency:
            vllm_side = {k: rows[name][f"c{c}"]["counters"][k] for k in ("num_drafts", "accepted_per_pos")}
            dh_side = total(ours["per_prompt"], level_prompts(args, c))
            levels[f"c{c}"] = {"prompts": level_prompts(args, c), "vllm": vllm_side, "draftheads": dh_side,
                               "equal": vllm_side == dh_side}
        comparison[name] = {"levels": levels, "draftheads_seconds": ours["seconds"],
                            "equal_at_every_concurrency": all(v["equal"] for v in levels.values())}
    import transformers

    result = {
        "command": " ".join(["python", "benchmarks/bench_vllm_serving.py", *(argv if argv is not None else sys.argv[1:])]),
        "args": {**{k: v for k, v in vars(args).items() if k != "vllm_python"}, "target_dir": target_dir},
        "environment": {
            "vllm": raw["vllm_version"], "cpu": cpu_name(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "torch_draftheads_side": torch.__version__, "transformers_draftheads_side": transformers.__version__,
            "loadavg_start": load_start, "loadavg_end": os.getloadavg(), "vllm_seconds": vllm_seconds,
        },
        "engine_configs": configs,
        "engines": rows,
        "acceptance_comparison": comparison,
    }
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "results.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
