"""What a plain step of the decode loop costs against a step of `target.generate`, before/after.

    python benchmarks/plain_step.py --heads medusa=PATH --heads eagle=PATH [--baseline-src DIR] \
        [--target smollm2] [--questions mt-bench] [--num-prompts 4] [--temperatures 0,1.0] [--rounds 8] \
        [--max-new-tokens 128] [--out DIR]

The online draft budget (`inference.draft_budget`) caps a step at depth 0 when speculation does
not pay: a plain step, the root alone, still run through the one decode loop. It is only worth
taking if it costs no more than a step of `generate`. Here every step is plain (a budget that
always answers 0), so the decoder's tokens/s against `generate`'s with the same sampling settings
is the plain step's price.

Each round is a fresh subprocess per code version (``--baseline-src``: a checkout before the
change, `git archive C | tar -x -C DIR`), alternating which goes first, so both see the same load.
Inside a round every prompt (benchmarks/prompts.py: the first turns of ``--questions``) is decoded by
`generate` and by each heads' plain-only decoder in a rotating order, at each temperature
(top-k/top-p off). Per round and version: tokens/s of each decoder over `generate`'s (summed over
the prompts), the time per step outside the target forward (the forward is timed by wrapping it),
and, in an untimed run, tensor operations and host reads of device data per step outside the
forward (`inference.host_syncs`, loaded from this checkout for both versions), which machine load
does not blur. Greedy outputs are checked against `generate`'s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from draftheads.atomic import write_text_atomically
from prompts import add_arguments, load_prompts

HERE = Path(__file__).resolve().parents[1]

ROUND = r"""
import functools, importlib.util, json, os, sys, time
import torch
import draftheads as dh
from draftheads.inference.draft_budget import DraftBudget
from draftheads.target import load_target

args = json.loads(sys.argv[1])
torch.set_num_threads(1)
target, tok = load_target(args["target"], device=torch.device("cpu"), dtype="auto")
pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


class AlwaysPlain(DraftBudget):
    name = "always-plain"

    def choose(self, rows):
        return 0


def heads_for(spec):
    # PATH, or random:TYPE (untrained heads: a plain step never drafts, so their weights do not matter)
    if spec.startswith("random:"):
        kind = spec.split(":", 1)[1]
        torch.manual_seed(0)
        return dh.MedusaHeads.for_target(target, num_heads=3) if kind == "medusa" else dh.EagleHead.for_target(target)
    return dh.load_heads(spec, target=target)


heads = {name: heads_for(spec) for name, spec in args["heads"].items()}
decoders = {name: dh.SpeculativeDecoder(target, h, draft_budget=AlwaysPlain()) for name, h in heads.items()}
prompts = [torch.tensor([ids]) for ids in args["prompt_ids"]]
new = args["max_new_tokens"]

forward_seconds = [0.0]
inner = target.forward


@functools.wraps(inner)
def timed_forward(*a, **k):
    t0 = time.perf_counter()
    try:
        return inner(*a, **k)
    finally:
        forward_seconds[0] += time.perf_counter() - t0


target.forward = timed_forward


def plain(ids, temperature, seed, new=new):
    sampling = {"do_sample": False} if temperature == 0 else {"do_sample": True, "temperature": temperature, "top_k": 0,
                                                              "top_p": 1.0}
    torch.manual_seed(seed)
    return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, pad_token_id=pad,
                           eos_token_id=[], **sampling)


def run(name, ids, temperature, seed, new=new):
    if name == "generate":
        return plain(ids, temperature, seed, new)
    return decoders[name].generate(ids, max_new_tokens=new, temperature=temperature, top_k=0, top_p=1.0,
                                   eos_token_id=[], seed=seed).sequences


names = ["generate", *decoders]
rows, index = [], 0
with torch.inference_mode():
    for name in names:  # untimed warm-up: first calls pay lazy initialisation
        for temperature in args["temperatures"]:
            run(name, prompts[0][:, :32], temperature, 0)
    for temperature in args["temperatures"]:
        for p, ids in enumerate(prompts):
            order = names[index % len(names):] + names[: index % len(names)]
            index += 1
            outs = {}
            for name in order:
                forward_seconds[0] = 0.0
                t0 = time.perf_counter()
                outs[name] = run(name, ids, temperature, p)
                seconds = time.perf_counter() - t0
                rows.append({"temperature": temperature, "prompt": p, "variant": name, "seconds": seconds,
                             "forward_seconds": forward_seconds[0], "tokens": outs[name].shape[1] - ids.shape[1]})
            if temperature == 0:
                for name in decoders:
                    rows[-len(names) + order.index(name)]["exact"] = bool(torch.equal(outs[name], outs["generate"]))

counts = None
if args["count"]:
    spec = importlib.util.spec_from_file_location("host_syncs", args["counter"])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    counts, short = {}, min(new, 32)  # the counter dispatches every op through Python: a short run
    with torch.inference_mode():
        for temperature in args["temperatures"]:
            for name in names:
                with mod.HostSyncCounter(target, *heads.values()) as c:
                    out = run(name, prompts[0], temperature, 0, short)
                steps = out.shape[1] - prompts[0].shape[1] - 1  # the first token comes from the prefill
                counts[f"{temperature:g}/{name}"] = {"ops": (c.ops_outside) / steps,
                                                     "host_reads": c.total_outside / steps}
print(json.dumps({"rows": rows, "counts": counts, "package": dh.__file__, "load": os.getloadavg()[0]}))
"""


def run_round(src: str, args: argparse.Namespace, prompt_ids: list[list[int]], count: bool) -> dict:
    """One subprocess decoding every prompt with every variant, with the package from ``src``."""
    payload = {"target": args.target, "heads": dict(h.split("=", 1) for h in args.heads), "prompt_ids": prompt_ids,
               "max_new_tokens": args.max_new_tokens, "temperatures": [float(t) for t in args.temperatures.split(",")],
               "count": count, "counter": str(HERE / "draftheads" / "inference" / "host_syncs.py")}
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    # cwd=src: `python -c` puts the working directory first on sys.path, so run from another checkout
    # it would import that checkout's package whatever PYTHONPATH says.
    done = subprocess.run([sys.executable, "-c", ROUND, json.dumps(payload)], env=env, cwd=src, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"round with {src} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).resolve().is_relative_to(Path(src).resolve()):
        raise SystemExit(f"the run meant for {src} imported draftheads from {result['package']}")
    return result


def round_figures(rows: list[dict]) -> dict[tuple[float, str], dict[str, float]]:
    """Per (temperature, decoder) of one round: tokens/s over generate's (tokens and seconds summed
    over the prompts), and ms per step outside the target forward of the decoder and of generate."""
    def total(t, name, key):
        return sum(r[key] for r in rows if r["temperature"] == t and r["variant"] == name)

    def outside_ms(t, name):
        steps = sum(r["tokens"] - 1 for r in rows if r["temperature"] == t and r["variant"] == name)
        return 1000 * (total(t, name, "seconds") - total(t, name, "forward_seconds")) / max(steps, 1)

    figures = {}
    for t in sorted({r["temperature"] for r in rows}):
        gen_rate = total(t, "generate", "tokens") / total(t, "generate", "seconds")
        for name in sorted({r["variant"] for r in rows} - {"generate"}):
            exact = [r["exact"] for r in rows if r["temperature"] == t and r["variant"] == name and "exact" in r]
            figures[(t, name)] = {"ratio": total(t, name, "tokens") / total(t, name, "seconds") / gen_rate,
                                  "outside_ms": outside_ms(t, name), "generate_outside_ms": outside_ms(t, "generate"),
                                  "exact": all(exact) if exact else None}
    return figures


def table(results: dict, counts: dict, versions: list[str]) -> list[str]:
    lines = ["| code | T | heads | plain-only tokens/s / generate's, median (min-max) over rounds | "
             "ms/step outside forward: decoder vs generate (medians) | tensor ops/step outside forward: decoder vs generate "
             "| host reads/step | greedy == generate |", "|---|---|---|---|---|---|---|---|"]
    for name in versions:
        for (t, heads), per_round in sorted(results[name].items()):
            ratios = [f["ratio"] for f in per_round]
            c, g = counts[name].get(f"{t:g}/{heads}", {}), counts[name].get(f"{t:g}/generate", {})
            exact = [f["exact"] for f in per_round if f["exact"] is not None]
            lines.append(
                f"| {name} | {t:g} | {heads} | {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) | "
                f"{statistics.median(f['outside_ms'] for f in per_round):.3f} vs "
                f"{statistics.median(f['generate_outside_ms'] for f in per_round):.3f} | "
                f"{c.get('ops', 0):.1f} vs {g.get('ops', 0):.1f} | {c.get('host_reads', 0):.2f} vs {g.get('host_reads', 0):.2f} | "
                f"{('yes' if all(exact) else 'NO') if exact else '-'} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, num=4)
    ap.add_argument("--heads", action="append", required=True,
                    help="NAME=PATH, or NAME=random:medusa / NAME=random:eagle (untrained: plain steps never draft)")
    ap.add_argument("--baseline-src", default=None, help="a checkout before the change; without it, this code only")
    ap.add_argument("--temperatures", default="0,1.0")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from draftheads.target import resolve_target

    tokenizer = AutoTokenizer.from_pretrained(resolve_target(args.target))
    prompt_ids = [p[0].tolist() for p in load_prompts(tokenizer, args.questions, args.num_prompts)]
    versions = {"after": str(HERE)}
    if args.baseline_src:
        versions["before"] = args.baseline_src
    results: dict[str, dict] = {name: {} for name in versions}
    counts: dict[str, dict] = {}
    loads = []
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(versions)[::-1]
        for name in order:
            got = run_round(versions[name], args, prompt_ids, count=(r == 0))
            loads.append(got["load"])
            counts[name] = counts.get(name) or got["counts"]
            for key, figures in round_figures(got["rows"]).items():
                results[name].setdefault(key, []).append(figures)
            print(name, r, {f"{t:g}/{h}": round(f["ratio"], 3) for (t, h), f in round_figures(got["rows"]).items()},
                  f"load {got['load']:.2f}", flush=True)
    lines = [f"# Plain-only decoder vs target.generate (target {args.target}, {args.num_prompts} prompts x "
             f"{args.max_new_tokens} tokens, {args.rounds} rounds, 1 thread; 1-min load average "
             f"{min(loads):.2f}-{max(loads):.2f})", "", *table(results, counts, list(versions))]
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        serial = {name: {f"{t:g}/{h}": v for (t, h), v in res.items()} for name, res in results.items()}
        write_text_atomically(out / "results.json", json.dumps(
            {"args": vars(args), "rounds": serial, "counts": counts, "loads": loads}, indent=1))
        write_text_atomically(out / "results.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
