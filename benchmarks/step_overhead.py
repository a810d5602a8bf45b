"""Per-step time outside the target forward, and host reads of device data per step, before/after.

    python benchmarks/step_overhead.py --heads runs/demo/heads [--target demo] [--baseline-src DIR]
        [--rounds 4] [--prompts 4] [--max-new-tokens 64] [--out DIR]

Each round is a fresh subprocess per code version, alternating (after, before, after, ...), so both
see the same machine load. A round decodes the same held-out prompts greedily with the heads
(their saved tree) and reports, per prompt, (decode time - verify-forward time) / steps, the
tokens/s, and (in one extra untimed run) the host reads of device data and the tensor operations
outside the target forward per step (each a kernel launch on an accelerator: a step-overhead
measure that machine load does not blur) counted by `draftheads.inference.host_syncs` (loaded
from this checkout by path for both versions).
``--baseline-src``: a checkout of the package before the change (`git archive C | tar -x -C DIR`).
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

HERE = Path(__file__).resolve().parents[1]

ROUND = r"""
import importlib.util, json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
import draftheads as dh
from draftheads.demo import corpus_texts, resolve_target

target_name, heads_dir, n_prompts, max_new, counter_path, count = sys.argv[1:7]
torch.set_num_threads(1)
path = resolve_target(target_name)
tok = AutoTokenizer.from_pretrained(path)
target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
heads = dh.load_heads(heads_dir, target=target)
decoder = dh.SpeculativeDecoder(target, heads)
texts = [t for t in corpus_texts("heldout") if len(t) > 2000][: int(n_prompts)]
prompts = [torch.tensor([tok(t).input_ids[:128]]) for t in texts]
decoder.generate(prompts[0], max_new_tokens=8, eos_token_id=[])  # warm-up
rows = []
for ids in prompts:
    out = decoder.generate(ids, max_new_tokens=int(max_new), eos_token_id=[])
    steps = max(out.stats["steps"], 1)
    rows.append({"outside_ms": 1000 * (out.decode_seconds - out.target_seconds) / steps,
                 "tokens_per_s": out.num_new_tokens / out.decode_seconds, "steps": steps,
                 "sequence": out.sequences[0].tolist()})
syncs = None
if count == "1":
    spec = importlib.util.spec_from_file_location("host_syncs", counter_path)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    with torch.inference_mode(), mod.HostSyncCounter(target, heads) as c:
        out = decoder.generate(prompts[0], max_new_tokens=int(max_new), eos_token_id=[])
    syncs = {"steps": out.stats["steps"], "outside": dict(c.outside), "inside": dict(c.inside),
             "ops_outside": c.ops_outside}
print(json.dumps({"rows": rows, "syncs": syncs, "package": dh.__file__}))
"""


def run_round(src: str, args: argparse.Namespace, count: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    counter = str(HERE / "draftheads" / "inference" / "host_syncs.py")
    cmd = [sys.executable, "-c", ROUND, args.target, args.heads, str(args.prompts), str(args.max_new_tokens), counter,
           "1" if count else "0"]
    # cwd=src: `python -c` puts the working directory first on sys.path, so run from another
    # checkout it would import THAT package, whatever PYTHONPATH says (an earlier version of this
    # script compared the current code with itself that way).
    done = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"round with {src} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).resolve().is_relative_to(Path(src).resolve()):
        raise SystemExit(f"the run meant for {src} imported draftheads from {result['package']}")
    return result


def spread(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "min": min(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="demo")
    ap.add_argument("--heads", required=True)
    ap.add_argument("--baseline-src", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    versions = {"after": str(HERE), "before": args.baseline_src}
    results: dict[str, dict] = {name: {"outside_ms": [], "tokens_per_s": [], "syncs": None} for name in versions}
    sequences: dict[str, list] = {}
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(versions)[::-1]
        for name in order:
            got = run_round(versions[name], args, count=(r == 0))
            results[name]["outside_ms"] += [row["outside_ms"] for row in got["rows"]]
            results[name]["tokens_per_s"] += [row["tokens_per_s"] for row in got["rows"]]
            results[name]["syncs"] = results[name]["syncs"] or got["syncs"]
            sequences.setdefault(name, [row["sequence"] for row in got["rows"]])
            print(name, r, json.dumps({k: round(statistics.median(v), 3) for k, v in results[name].items() if k != "syncs"}),
                  flush=True)
    same = sequences["after"] == sequences["before"]
    summary = {name: {"outside_ms": spread(v["outside_ms"]), "tokens_per_s": spread(v["tokens_per_s"]), "syncs": v["syncs"]}
               for name, v in results.items()}
    ratio = [a / b for a, b in zip(results["after"]["outside_ms"], results["before"]["outside_ms"])]
    summary["after_over_before_outside"] = spread(ratio)
    summary["identical_outputs"] = same
    lines = [f"# Per-step time outside the target forward (demo target, heads {args.heads}, 1 thread)", "",
             "| code | outside ms/step median (q1-q3) | tokens/s median (q1-q3) | host reads/step outside forward (ours) | inside forward | tensor ops/step outside forward |",
             "|---|---|---|---|---|---|"]
    for name in versions:
        s = summary[name]
        syn = s["syncs"]
        per = sum(syn["outside"].values()) / syn["steps"]
        inside = sum(syn["inside"].values()) / syn["steps"]
        lines.append(f"| {name} | {s['outside_ms']['median']:.2f} ({s['outside_ms']['q1']:.2f}-{s['outside_ms']['q3']:.2f}) | "
                     f"{s['tokens_per_s']['median']:.1f} ({s['tokens_per_s']['q1']:.1f}-{s['tokens_per_s']['q3']:.1f}) | "
                     f"{per:.2f} {syn['outside']} | {inside:.2f} | {syn.get('ops_outside', 0) / syn['steps']:.1f} |")
    r = summary["after_over_before_outside"]
    lines += ["", f"after/before outside-forward time, paired per prompt and round: median {r['median']:.3f} "
                  f"(q1 {r['q1']:.3f}, q3 {r['q3']:.3f}); identical outputs: {same}"]
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out / "results.json", json.dumps({"args": vars(args), "summary": summary}, indent=1))
        write_text_atomically(out / "results.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
