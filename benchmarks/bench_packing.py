"""Sequence packing vs padded batches in a real heads training step, on CPU.

    python benchmarks/bench_packing.py [--head-type eagle3] [--max-length 512] [--rounds 3] \
        [--out benchmarks/measurements/packing]

1. A chat set with a realistic length spread (``scale_setup.chat_rows``: Spec-Bench questions
   with log-normal answers cut from stdlib text), each conversation's turns joined as one text
   row for the demo target's tokenizer (it has no chat template), truncated to ``--max-length``.
2. Padding fraction over a whole epoch: random batches (training's default order),
   ``train.group_by_length`` batches, and ``data.packing`` windows (batch_size windows).
3. Real (non-padding) tokens/s of full training steps (frozen demo target forward, the heads'
   loss, backward, AdamW step) through draftheads' own code (``TargetWithHeads``, the packing
   collator): per round and arm, randomly drawn batches of that arm's epoch (what training sees)
   until ``--tokens`` real tokens, the order of the arms rotating per round.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_setup import chat_rows  # noqa: E402

from draftheads.data import Collator  # noqa: E402
from draftheads.data.packing import PackingCollator, pack_dataset  # noqa: E402
from draftheads.data.sampling import LengthGroupedSampler  # noqa: E402
from draftheads.data.tokenize import tokenize_text  # noqa: E402
from draftheads.train.model import TargetWithHeads  # noqa: E402

ARMS = ("random", "grouped", "packed")


def rows_as_text(tokenizer, n: int, max_length: int) -> list[dict]:
    out = []
    for row in chat_rows(n):
        text = "\n\n".join(turn["value"] for turn in row["conversations"])
        ids, mask = tokenize_text(tokenizer, text, max_length, chunk=False)[0]
        out.append({"input_ids": ids, "loss_mask": mask})
    return out


def arrange(rows: list[dict], idx: list[int], arm: str, batch_size: int, window: int, seed: int, pad: int) -> list[dict]:
    """The rows ``idx`` as batches of one arm."""
    sub = [rows[i] for i in idx]
    lengths = [len(r["input_ids"]) for r in sub]
    collate = Collator(pad)
    if arm == "random":
        order = list(range(len(sub)))
        random.Random(seed).shuffle(order)
        groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    elif arm == "grouped":
        groups = LengthGroupedSampler(lengths, batch_size, seed=seed).batches()
    else:
        ds, _ = pack_dataset(sub, lengths, window)
        packed = PackingCollator(collate)
        items = [ds[i] for i in range(len(ds))]
        return [packed(items[i : i + batch_size]) for i in range(0, len(items), batch_size)]
    return [collate([sub[i] for i in g]) for g in groups]


def padding(batches: list[dict]) -> float:
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    return 1.0 - real / sum(b["input_ids"].numel() for b in batches)


def train_steps(model, opt, batches: list[dict]) -> tuple[int, float]:
    tokens, start = 0, time.perf_counter()
    for b in batches:
        counts = model.loss_counts(b["input_ids"], b["attention_mask"], b["loss_mask"], b.get("position_ids"))
        loss = model(**b, loss_denominators=counts.float())["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        tokens += int(b["attention_mask"].sum())
    return tokens, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=480)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--head-type", default="eagle3", choices=["eagle3", "medusa"])
    p.add_argument("--tokens", type=int, default=6000, help="real tokens per arm and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--target", type=Path, default=Path.home() / ".cache/draftheads/demo-target-54d996a994fe")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    import draftheads as dh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = args.target  # the built demo target (never rebuilt here)
    tokenizer = AutoTokenizer.from_pretrained(path)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = rows_as_text(tokenizer, args.rows, args.max_length)
    lengths = [len(r["input_ids"]) for r in rows]

    every = list(range(len(rows)))
    epochs = {arm: arrange(rows, every, arm, args.batch_size, args.max_length, 0, pad) for arm in ARMS}
    epoch = {arm: padding(b) for arm, b in epochs.items()}

    torch.manual_seed(0)
    if args.head_type == "eagle3":
        heads = dh.Eagle3Head.for_target(target, num_heads=3, draft_vocab_size=2048)
        heads.set_draft_vocab(torch.bincount(torch.tensor([t for r in rows for t in r["input_ids"]]), minlength=target.config.vocab_size))
    else:
        heads = dh.MedusaHeads.for_target(target, num_heads=3)
    model = TargetWithHeads(target, heads, labels="target")
    opt = torch.optim.AdamW(heads.parameters(), lr=1e-4)

    warm = arrange(rows, every[: args.batch_size], "packed", args.batch_size, args.max_length, 0, pad)
    train_steps(model, opt, warm)
    rng = random.Random(1)
    per_round = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        order = ARMS[r % 3 :] + ARMS[: r % 3]
        for arm in order:
            batches, real = [], 0
            while real < args.tokens:
                batches.append(rng.choice(epochs[arm]))
                real += int(batches[-1]["attention_mask"].sum())
            tokens, seconds = train_steps(model, opt, batches)
            per_round[arm].append(tokens / seconds)
            print(f"round {r} {arm:8s} {len(batches)} batches, padding {padding(batches):.3f}: {tokens / seconds:.0f} real tok/s", flush=True)

    ratio = {
        f"packed/{b}": [p_ / q for p_, q in zip(per_round["packed"], per_round[b])] for b in ("random", "grouped")
    }
    result = {
        "command": "benchmarks/bench_packing.py " + " ".join(sys.argv[1:]),
        "rows": len(rows),
        "length": {"median": statistics.median(lengths), "min": min(lengths), "max": max(lengths), "total": sum(lengths)},
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "head_type": args.head_type,
        "target": f"demo target {target.config.num_hidden_layers}x{target.config.hidden_size}, fp32, sdpa, {args.threads} thread(s)",
        "epoch_padding_fraction": epoch,
        "per_round_real_tokens_per_second": per_round,
        "ratios_per_round": ratio,
        "ratio_median": {k: statistics.median(v) for k, v in ratio.items()},
        "load_average": os.getloadavg(),
    }
    print(json.dumps({k: result[k] for k in ("length", "epoch_padding_fraction", "ratios_per_round", "ratio_median", "load_average")}, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"packing-{args.head_type}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
