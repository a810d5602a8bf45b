"""How much of the target a draft vocabulary covers on held-out text.

    python benchmarks/draft_vocab_coverage.py HEADS [--config configs/demo-eagle3.yaml] [--windows 64] [--temperature 1.0]

For EAGLE-3 / P-EAGLE heads (their own draft vocabulary): the share of the config's held-out data
tokens outside it, and, over ``--windows`` held-out windows of 256 tokens, the target's probability
mass at ``--temperature`` outside it and how often its greedy token is. A token outside the draft
vocabulary is never drafted, so that mass bounds first-draft acceptance under sampling from above.
"""
import argparse

import torch

from draftheads import load_heads
from draftheads.config import load_config
from draftheads.data import build_datasets
from draftheads.target import load_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heads")
    ap.add_argument("--config", default="configs/demo-eagle3.yaml")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    args = ap.parse_args()
    cfg = load_config(args.config)
    target, tokenizer = load_target(cfg.target.name_or_path)
    heads = load_heads(args.heads, target=target)
    inside = heads.target_to_draft >= 0
    _, heldout, _ = build_datasets(cfg.data, tokenizer)
    ids = torch.cat([torch.tensor(heldout[i]["input_ids"]) for i in range(len(heldout))])
    windows = ids[: args.windows * 256]
    windows = windows[: windows.numel() // 256 * 256].view(-1, 256)
    with torch.no_grad():
        probs = (target(windows).logits / args.temperature).softmax(-1)
    print(f"draft vocabulary: {int(inside.sum())} of {inside.numel()} tokens")
    print(f"held-out data tokens outside it: {float((~inside[ids]).float().mean()):.4f} of {ids.numel()}")
    print(f"target mass outside it at T={args.temperature:g}: {float(probs[..., ~inside].sum(-1).mean()):.4f} "
          f"({windows.shape[0]} windows of 256)")
    print(f"target greedy token outside it: {float((~inside[probs.argmax(-1)]).float().mean()):.4f}")


if __name__ == "__main__":
    main()
