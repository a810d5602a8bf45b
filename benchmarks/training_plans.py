"""What training's plan choice decides for trained heads: per temperature, the tree, its ratio to
`target.generate` and whether the entry goes plain, with the seconds it costs.

    python -m benchmarks.training_plans --heads COPY_OF/heads [--target demo] [--rows 8]
        [--temperatures 0,0.7,1.0] [--timing-only] [--write] [--out DIR]

Runs exactly what the end of a training run runs (`tune.training.choose_export_plans`: the tree
per temperature, then each timed against `generate` at batch size 1) on held-out rows: the first
``--rows`` demo held-out standard-library files longer than 2000 characters, 256 tokens each (a
training window of configs/demo*.yaml), the final evaluation's acceptance table read from the run's
metrics.json next to the heads folder. ``--write`` saves the result as the folder's tree.json
(give a COPY of a run's heads). ``--timing-only`` skips the tree search and times the trees the
folder's tree.json holds for this device type (the second stage alone: what it costs, and a repeat
of its verdict). Prints the machine load before and after: on a shared machine the ratios move
with it. Run it with ``python -m`` from the checkout, so that the checkout's draftheads is imported.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch


def held_out_rows(tokenizer, count: int, length: int = 256) -> list[torch.Tensor]:
    """The first ``count`` held-out files' first ``length`` tokens (files the target and its heads
    never trained on; the same files `draftheads bench` prompts from)."""
    from draftheads.demo import corpus_texts

    texts = [t for t in corpus_texts("heldout") if len(t) > 2000][:count]
    return [torch.tensor(tokenizer(t[: 32 * length]).input_ids[:length]) for t in texts]


def rank_accuracy(heads_dir: Path):
    """The final evaluation's acceptance table of the run that trained these heads, if known."""
    metrics = heads_dir.parent / "metrics.json"
    if not metrics.is_file():
        return None
    return json.loads(metrics.read_text()).get("final_eval", {}).get("eval/rank_accuracy")


def time_saved_trees(target, heads, rows, temperatures):
    """The second stage of training's choice alone: each temperature's saved batch-1 entry for
    this device type (its tree, plain or not) timed against generate, as `choose_export_plans` does."""
    from draftheads.plans import TreePlans, select
    from draftheads.tune.tables import entries_for
    from draftheads.tune.training import check_against_generate

    chosen, entries = [], []
    for temperature in temperatures:
        entry = select(heads.plans, target.device.type, 1, temperature).entry
        if entry is None or entry.tree is None:
            raise SystemExit(f"error: no saved tree for temperature {temperature:g} on {target.device.type}")
        data = {**entry.measured, "tree": entry.tree, "draft_vocab_size": entry.draft_vocab_size,
                "temperature": temperature, "device_type": target.device.type, "chosen_by": entry.chosen_by}
        data.pop("batch", None)
        batch = check_against_generate(target, heads, data, rows)
        entries += entries_for(data["tree"], data["draft_vocab_size"], data, data["device_type"], temperature,
                               batch=batch, chosen_by=entry.chosen_by)
        chosen.append(data)
    return TreePlans(tuple(entries)), chosen


def load() -> str:
    """The 1/5/15-minute load averages (2 shared cores here: above 2, timings stretch)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", required=True)
    parser.add_argument("--target", default="demo")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--temperatures", default="0,0.7,1.0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timing-only", action="store_true", help="time the saved trees, no tree search")
    parser.add_argument("--write", action="store_true", help="save the result as the heads folder's tree.json")
    parser.add_argument("--out", default=None, help="folder for result.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.plans import parse_temperatures, write_plans
    from draftheads.target import load_target
    from draftheads.tune.training import choose_export_plans, summarize

    heads_dir = Path(args.heads)
    target, tokenizer = load_target(args.target, device=torch.device("cpu"), dtype="float32")
    heads = dh.load_heads(heads_dir, target=target)
    rows = held_out_rows(tokenizer, args.rows)
    before = load()
    started = time.perf_counter()
    temperatures = tuple(parse_temperatures(args.temperatures))
    if args.timing_only:
        plans, chosen = time_saved_trees(target, heads, rows, temperatures)
    else:
        plans, chosen = choose_export_plans(target, heads, rows, rank_accuracy(heads_dir), temperatures)
    summary = summarize(chosen, time.perf_counter() - started)
    after = load()
    print(f"{heads.head_type} heads {heads_dir}; load average before {before}, after {after}")
    print(f"{'T':>4} | {'tree':<70} | {'spec/generate median (min-max)':<30} | {'entry':<11} | s timed")
    for data in chosen:
        d = summary["temperatures"][f"{data['temperature']:g}"]
        vs = d.get("vs_generate")
        ratio = f"{vs['median']:.2f}x ({vs['min']:.2f}-{vs['max']:.2f})" if vs else "not timed"
        tree = data["tree"] if isinstance(data["tree"], dict) else f"{len(data['tree']) + 1} nodes"
        vocab = data.get("draft_vocab_size")
        print(f"{data['temperature']:>4g} | {str(tree) + (f', vocab {vocab}' if vocab else ''):<70} | {ratio:<30} | "
              f"{d['mode']:<11} | {vs['seconds'] if vs else 0:.1f}")
    print(f"total {summary['seconds']:.1f} s, of which {summary['vs_generate_seconds']:.1f} s timing against generate")
    if args.write:
        print(f"-> {write_plans(heads_dir, plans)}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result = {"heads": str(heads_dir), "head_type": heads.head_type, "load_before": before, "load_after": after,
                  "threads": args.threads, "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                  "summary": summary, "plans": plans.to_json()}
        (out / f"{heads.head_type}.json").write_text(json.dumps(result, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
