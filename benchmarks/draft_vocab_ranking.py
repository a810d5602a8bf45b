"""Which tokens a draft vocabulary should hold: ranked by data frequency (what training does today)
or by the target's own probability mass, scored on held-out text.

    python benchmarks/draft_vocab_ranking.py [--config configs/demo-eagle3.yaml] [--train-windows 128] [--sizes 2048,3072,4096]

EAGLE-3 and P-EAGLE draft only inside their vocabulary, so the target's probability mass outside it
bounds first-draft acceptance under sampling from above (`draft_vocab_coverage.py`). Training picks
the most frequent trained tokens of the data. This ranks the vocabulary four ways over the config's
training windows: data frequency, the target's greedy tokens, and the target's summed probabilities
at T=1 and T=0.7; then, over 64 held-out windows, it prints each ranking's mass outside at T=1 and
T=0.7 and how often the greedy token falls outside. No heads are needed; one thread.
"""
import argparse

import torch

from draftheads.config import load_config
from draftheads.data import build_datasets
from draftheads.target import load_target
from draftheads.train.components import training_token_counts

WINDOW = 256


def windows(dataset, count: int) -> torch.Tensor:
    ids = torch.cat([torch.tensor(dataset[i]["input_ids"]) for i in range(len(dataset))])[: count * WINDOW]
    return ids[: ids.numel() // WINDOW * WINDOW].view(-1, WINDOW)


@torch.no_grad()
def logits_of(target, rows: torch.Tensor) -> torch.Tensor:
    return torch.cat([target(rows[i : i + 8]).logits.float() for i in range(0, rows.shape[0], 8)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/demo-eagle3.yaml")
    ap.add_argument("--train-windows", type=int, default=128)
    ap.add_argument("--sizes", default="2048,3072,4096")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config)
    target, tokenizer = load_target(cfg.target.name_or_path)
    train, heldout, _ = build_datasets(cfg.data, tokenizer)
    vocab = target.config.vocab_size
    seen = logits_of(target, windows(train, args.train_windows))
    rankings = {
        "data frequency": training_token_counts(train, vocab).double(),
        "target greedy": torch.bincount(seen.argmax(-1).flatten(), minlength=vocab).double(),
        "target mass T=1": seen.softmax(-1).sum((0, 1)).double(),
        "target mass T=0.7": (seen / 0.7).softmax(-1).sum((0, 1)).double(),
    }
    del seen
    held = logits_of(target, windows(heldout, 64))
    print(f"{args.train_windows} training windows ranked, 64 held-out windows scored, {WINDOW} tokens each")
    print("| size | ranked by | held-out mass outside, T=1 | T=0.7 | greedy token outside |")
    print("|---:|---|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        for name, score in rankings.items():
            inside = torch.zeros(vocab, dtype=torch.bool)
            inside[score.topk(size).indices] = True
            outside = [float((held / t).softmax(-1)[..., ~inside].sum(-1).mean()) for t in (1.0, 0.7)]
            greedy = float((~inside[held.argmax(-1)]).float().mean())
            print(f"| {size} | {name} | {outside[0]:.4f} | {outside[1]:.4f} | {greedy:.4f} |", flush=True)


if __name__ == "__main__":
    main()
