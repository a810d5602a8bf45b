"""Heads-training throughput and memory of a config, and of variants of it, side by side.

    python benchmarks/training_throughput.py --config configs/smollm2.yaml [--steps 20] [--rounds 2] \\
        [--variant packed=data.packing=true] [--variant grouped=train.group_by_length=true] \\
        [--variant kept-logits=train.loss_checkpointing=false] [--feature-cache] [--out DIR] [key=value ...]

Every run is the real training command (``draftheads train``, one process) for ``--steps`` optimizer
steps into a fresh folder, with mid-run evaluation, checkpoints and the tree choice off, so the
figures are training steps only. ``base`` is the config as it is (plus the trailing ``key=value``
overrides, applied to every variant); each ``--variant NAME=key=value[;key=value]`` adds overrides.
``--feature-cache`` first builds the config's feature cache once (``draftheads cache-features``, timed
and reported) and adds the variant ``feature-cache`` that trains from it (``data.features``).

Rounds run every variant once each, in an order that rotates from round to round, so a machine whose
load drifts slows them alike. Reported per variant: training tokens/s (``metrics.json``'s
``train_tokens_per_second``: supervised tokens over the seconds spent in training steps) as the
median and min-max over rounds, its ratio to ``base`` in the same round, the run's wall seconds, and
the peak memory of the process (host RSS; on CUDA also the peak allocated device memory).
Writes DIR/results.json and DIR/results.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
#: What every run sets: steps only, nothing between them.
QUIET = ("train.eval_every=0", "train.save_every=0", "train.choose_tree=false", "tracking.report_to=none")


def child(result_file: str, config: str, overrides: list[str]) -> int:
    """One training run in this process; writes its figures to ``result_file``."""
    import torch

    from draftheads.cli import main

    out_dir = next(o.split("=", 1)[1] for o in overrides if o.startswith("train.output_dir="))
    start = time.perf_counter()
    code = main(["train", "--config", config, *overrides])
    wall = time.perf_counter() - start
    if code != 0:
        return code
    metrics = json.loads((Path(out_dir) / "metrics.json").read_text())
    result = {"tokens_per_s": metrics["train_tokens_per_second"], "train_tokens": metrics["train_tokens"],
              "steps": metrics["step"], "wall_s": wall,
              "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
              "peak_cuda_mib": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None}
    Path(result_file).write_text(json.dumps(result))
    return 0


def parse_variants(items: list[str], p: argparse.ArgumentParser) -> dict[str, list[str]]:
    variants: dict[str, list[str]] = {"base": []}
    for item in items:
        name, sep, overrides = item.partition("=")
        if not sep or not name or "=" not in overrides:
            p.error(f"--variant takes NAME=key=value[;key=value], got {item!r}")
        if name in variants:
            p.error(f"--variant name {name!r} is taken")
        variants[name] = [o for o in overrides.split(";") if o]
    return variants


def run(cmd: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])}
    with log.open("w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {done.returncode}); its output: {log}")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


def markdown(result: dict) -> str:
    lines = [f"# Training throughput: {result['config']}", "", f"`{result['command']}`", "",
             f"{result['machine']}; {result['steps']} steps per run, {result['rounds']} round(s), one process.", "",
             "| variant | overrides | tokens/s, median (min-max) | vs base, median (min-max) | wall s | peak RSS MiB "
             "| peak CUDA MiB |", "|---|---|---|---|---|---|---|"]
    for name, v in result["variants"].items():
        runs = v["runs"]
        cuda = [r["peak_cuda_mib"] for r in runs if r["peak_cuda_mib"] is not None]
        lines.append(f"| {name} | `{' '.join(v['overrides']) or '-'}` | {spread([r['tokens_per_s'] for r in runs])} "
                     f"| {spread(v['vs_base'])} | {statistics.median(r['wall_s'] for r in runs):.0f} "
                     f"| {max(r['peak_rss_mib'] for r in runs):.0f} | {f'{max(cuda):.0f}' if cuda else '-'} |")
    if result.get("feature_cache"):
        lines += ["", f"Feature cache built once in {result['feature_cache']['seconds']:.0f} s "
                      f"({result['feature_cache']['dtype']})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1], argv[2], argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variant", action="append", default=[], metavar="NAME=key=value[;key=value]")
    p.add_argument("--feature-cache", action="store_true", help="also train from the config's feature cache")
    p.add_argument("--out", default="results/training-throughput")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="overrides for every variant")
    args = p.parse_args(argv)
    variants = parse_variants(args.variant, p)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import torch

    cache = None
    if args.feature_cache:
        dtype = "bfloat16" if torch.cuda.is_available() else "float32"
        start = time.perf_counter()
        run([sys.executable, "-m", "draftheads.cli", "cache-features", "--config", args.config, "--out",
             str(out / "features"), "--dtype", dtype, "--no-progress", *args.overrides], out / "cache-features.log")
        cache = {"seconds": time.perf_counter() - start, "dtype": dtype}
        variants["feature-cache"] = [f"data.features={out / 'features'}"]
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            folder = out / "runs" / f"{name}-r{r}"
            shutil.rmtree(folder, ignore_errors=True)
            figures = out / "runs" / f"{name}-r{r}.json"
            run([sys.executable, str(HERE), "--child", str(figures), args.config, *QUIET, *args.overrides,
                 *variants[name], f"train.max_steps={args.steps}", f"train.output_dir={folder}"], out / f"{name}-r{r}.log")
            runs[name].append(json.loads(figures.read_text()))
            shutil.rmtree(folder, ignore_errors=True)
            print(f"round {r} {name}: {runs[name][-1]['tokens_per_s']:.0f} tokens/s", flush=True)
    result = {
        "config": args.config, "steps": args.steps, "rounds": args.rounds, "command": " ".join(sys.argv),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                   + (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"),
        "date": time.strftime("%Y-%m-%d"), "feature_cache": cache,
        "variants": {name: {"overrides": variants[name], "runs": runs[name],
                            "vs_base": [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[name], runs["base"])]}
                     for name in variants},
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
