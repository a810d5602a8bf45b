"""`draftheads calibrate` on this machine, its report kept for the results page: the verify cost
curve by width it measures first, what it timed, the plan it saved, and `tune.explain.why`'s line.

    python benchmarks/calibrate_report.py --target smollm2 --heads runs/smollm2/heads --temperatures 0 \\
        --out results/epyc-calibrate

Runs ``draftheads calibrate --batch-sizes 1`` (the prompts: ``auto``, the package's user-like set)
in this process and writes ``OUT/results.md``: the command's output as it printed it, then the
plan's one-line explanation.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2")
    p.add_argument("--heads", required=True)
    p.add_argument("--temperatures", default="0")
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--num-prompts", default="12")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import torch

    from draftheads.cli import main as cli
    from draftheads.device import device_name
    from draftheads.plans import read_plans
    from draftheads.tune.explain import why

    torch.set_num_threads(2)
    command = ["calibrate", "--target", args.target, "--heads", args.heads, "--temperatures", args.temperatures,
               "--batch-sizes", args.batch_sizes, "--num-prompts", args.num_prompts]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli(command)
    sys.stdout.write(printed.getvalue())
    if code:
        return code
    plans = read_plans(args.heads)
    lines = [f"`draftheads {' '.join(command)}` on {device_name('cpu')}, {torch.get_num_threads()} threads:", "",
             "```", printed.getvalue().rstrip(), "```", ""]
    for t in (float(x) for x in args.temperatures.split(",")):
        lines.append(f"- {why(plans, 'cpu', device_name('cpu'), t)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
