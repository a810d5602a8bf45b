"""Seconds per training step (forward + backward) of a shipped config on its own windows, one thread.

    PYTHONPATH=TREE python benchmarks/config_step_time.py configs/demo-eagle3.yaml [STEPS]

Times the draftheads tree on PYTHONPATH, so two revisions compare as whole processes run in turn
(e.g. a `git worktree` of the older commit and this one, alternated over rounds); the first batch
is an untimed warm-up and its loss is printed so both trees can be checked to compute the same.
"""
import sys
import time

import torch

from draftheads.config import load_config
from draftheads.data import Collator, build_datasets
from draftheads.target import load_target
from draftheads.train.components import build_heads, training_token_counts
from draftheads.train.model import TargetWithHeads


def main() -> None:
    torch.set_num_threads(1)
    cfg = load_config(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    target, tokenizer = load_target(cfg.target.name_or_path)
    train_ds, _, _ = build_datasets(cfg.data, tokenizer)
    torch.manual_seed(0)
    heads = build_heads(cfg.heads, target, tokenizer=tokenizer)
    if hasattr(heads, "set_draft_vocab"):
        heads.set_draft_vocab(training_token_counts(train_ds, heads.config.vocab_size))
    t, size = cfg.train, cfg.train.batch_size
    model = TargetWithHeads(target, heads, loss_decay=t.loss_decay, loss_chunk_size=t.loss_chunk_size, topk=t.topk,
                            labels=t.labels, checkpoint_loss_chunks=t.loss_checkpointing)  # fmt: skip
    collate = Collator.from_tokenizer(tokenizer)
    batches = [collate([train_ds[i] for i in range(k * size, (k + 1) * size)]) for k in range(steps + 1)]

    def step(batch) -> float:
        torch.manual_seed(0)
        loss = model(**batch)["loss"]
        loss.backward()
        for p in heads.parameters():
            p.grad = None
        return loss.item()

    first = step(batches[0])
    start = time.perf_counter()
    for batch in batches[1:]:
        step(batch)
    print(f"{(time.perf_counter() - start) / steps:.3f} s/step loss0={first:.6f}")


if __name__ == "__main__":
    main()
