"""Do the two trainers compute the same loss? The reference's ``cnets.Model`` at its own fresh
init and the same weights imported into draftheads, on the first training batch (no training).

    python benchmarks/reference_eagle3/loss_check.py --eagle /path/to/EAGLE[.git] [--commit cb7e084] \\
        [--config configs/smollm2-eagle3.yaml] [--workdir runs/reference-eagle3-loss-check] [--steps 7]

Prints per unrolled step: the reference's summed soft cross-entropy (its per-step loss times
B x T, the positions it averages over) and its denominator B x T, against draftheads' summed
soft cross-entropy and its rows (those whose target argmax lies in the draft vocabulary). Equal
sums mean equal labels, masks and rows; the ratio of the denominators is the only thing the
loss normalisation changes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (this folder's side-by-side runner: the reference's plumbing)


@torch.no_grad()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eagle", required=True)
    ap.add_argument("--commit", default=None)
    ap.add_argument("--config", default=str(run.CONFIG), help="the EAGLE-3 config whose windows and target are used")
    ap.add_argument("--workdir", default="runs/reference-eagle3-loss-check")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from draftheads import load_heads
    from draftheads.config import load_config
    from draftheads.data import build_datasets
    from draftheads.export.importers import import_heads
    from draftheads.target import load_target
    from draftheads.train.model import TargetWithHeads

    workdir = Path(args.workdir).resolve()
    src, sha = run.reference_source(Path(args.eagle), args.commit, workdir)
    cnets, configs = run.import_reference(src)
    cfg = load_config(args.config)
    target, tokenizer = load_target(cfg.target.name_or_path)
    train_ds, _, _ = build_datasets(cfg.data, tokenizer)
    model = run.build_reference_model(cnets, configs, target, train_ds, cfg.heads.draft_vocab_size, args.steps,
                                      workdir, cfg.train.seed).eval()  # fmt: skip
    batch = next(run.training_batches(cfg, tokenizer, train_ds, 1))
    plosses, _, _ = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], loss_mask=batch["loss_mask"])
    run.save_reference_release(model, target, workdir / "release")
    import_heads(workdir / "release", workdir / "heads", target, overwrite=True)
    heads = load_heads(workdir / "heads", target=target)
    heads.config.num_heads = args.steps
    stats = TargetWithHeads(target, heads, labels="target").eval()(**batch)["stats"]
    bt = batch["input_ids"].numel()
    print(f"reference {sha[:7]}, first training batch ({tuple(batch['input_ids'].shape)}), fresh reference init")
    print("| step | reference sum CE | reference denominator (B x T) | draftheads sum CE | draftheads rows | sum ratio |")
    print("|---|---|---|---|---|---|")
    for k in range(args.steps):
        ref_sum, ours, rows = float(plosses[k]) * bt, float(stats[0, k]), int(stats[1, k])
        print(f"| {k} | {ref_sum:.2f} | {bt} | {ours:.2f} | {rows} | {ref_sum / ours:.5f} |")


if __name__ == "__main__":
    main()
