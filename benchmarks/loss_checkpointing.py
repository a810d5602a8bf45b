"""Training step time with the loss chunks checkpointed (recomputed in backward) vs kept
(`train.loss_checkpointing`), on a shipped config's own windows, interleaved, one thread.

    python benchmarks/loss_checkpointing.py configs/demo-eagle3.yaml [--rounds 3] [--steps 3]

Each round times forward + backward of the same ``--steps`` batches both ways, one after the
other; before timing it checks that both ways give the same loss and gradients bit for bit
(the global RNG reseeded before each: EAGLE's feature noise comes from it). Prints one line per
round with both times and their ratio.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    from draftheads.config import load_config
    from draftheads.data import Collator, build_datasets
    from draftheads.target import load_target
    from draftheads.train.components import build_heads, training_token_counts
    from draftheads.train.model import TargetWithHeads

    torch.set_num_threads(1)
    cfg = load_config(args.config)
    target, tokenizer = load_target(cfg.target.name_or_path)
    train_ds, _, _ = build_datasets(cfg.data, tokenizer)
    heads = build_heads(cfg.heads, target, tokenizer=tokenizer)
    if hasattr(heads, "set_draft_vocab"):
        heads.set_draft_vocab(training_token_counts(train_ds, heads.config.vocab_size))
    t, size = cfg.train, cfg.train.batch_size
    model = TargetWithHeads(target, heads, loss_decay=t.loss_decay, loss_chunk_size=t.loss_chunk_size, topk=t.topk,
                            labels=t.labels)  # fmt: skip
    collate = Collator.from_tokenizer(tokenizer)
    batches = [collate([train_ds[i] for i in range(k * size, (k + 1) * size)]) for k in range(args.steps + 1)]
    params = model.trainable_parameters()

    def step(batch, checkpointed: bool):
        model.checkpoint_loss_chunks = checkpointed
        torch.manual_seed(0)
        loss = model(**batch)["loss"]
        loss.backward()
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        return loss.detach(), grads

    (l1, g1), (l2, g2) = step(batches[0], True), step(batches[0], False)
    same = torch.equal(l1, l2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    print(f"{args.config}: the same loss and gradients both ways: {same}", flush=True)
    for r in range(args.rounds):
        seconds = {}
        for checkpointed in (True, False):
            start = time.perf_counter()
            for batch in batches[1:]:
                step(batch, checkpointed)
            seconds[checkpointed] = (time.perf_counter() - start) / args.steps
        print(f"round {r}: checkpointed {seconds[True]:.3f} s/step, kept {seconds[False]:.3f} s/step, "
              f"ratio {seconds[True] / seconds[False]:.2f}", flush=True)


if __name__ == "__main__":
    main()
