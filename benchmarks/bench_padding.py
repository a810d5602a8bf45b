"""Padding in heads training: random batches vs length-grouped batches vs packing, on CPU.

    python benchmarks/bench_padding.py [--out benchmarks/measurements/padding] [--layers 12 --hidden 512]

1. A chat dataset with a realistic length spread (``scale_setup.chat_rows``: Spec-Bench questions,
   log-normal answers) is tokenized as training does (ChatML, max_length 1024).
2. Padding fraction of an epoch's batches: random order (what training does by default),
   ``train.group_by_length``, and first-fit-decreasing packing into max_length sequences.
3. Real (non-padding) tokens/s of the target forward, which dominates a heads training step, for
   each arrangement on a random-weight Llama: per round, the same random ``--subset`` rows in
   random batches, length-grouped batches and packed sequences, the order rotating per round. Packing runs each sequence with a block-diagonal attention mask and
   positions restarting per row (what packing must do to stay exact), so its attention is
   quadratic in the packed length.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_setup import chat_rows, make_target, make_tokenizer  # noqa: E402

from draftheads.data.chat_mask import special_strings  # noqa: E402
from draftheads.data.formats import normalize_chat  # noqa: E402
from draftheads.data.sampling import LengthGroupedSampler, padding_fraction  # noqa: E402
from draftheads.data.tokenize import tokenize_chat  # noqa: E402


def pack_ffd(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: rows into sequences of at most ``capacity`` tokens."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, r in enumerate(room):
            if lengths[i] <= r:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


def padded_batch(ids: list[list[int]], rows: list[int], pad: int):
    width = max(len(ids[i]) for i in rows)
    x = torch.full((len(rows), width), pad)
    am = torch.zeros((len(rows), width), dtype=torch.long)
    for r, i in enumerate(rows):
        x[r, : len(ids[i])] = torch.tensor(ids[i])
        am[r, : len(ids[i])] = 1
    return {"input_ids": x, "attention_mask": am}


def packed_batch(ids: list[list[int]], seqs: list[list[int]], pad: int, dtype: torch.dtype):
    """Packed sequences: positions restart per row; a row attends only to itself, causally."""
    width = max(sum(len(ids[i]) for i in s) for s in seqs)
    x = torch.full((len(seqs), width), pad)
    pos = torch.zeros((len(seqs), width), dtype=torch.long)
    allowed = torch.zeros((len(seqs), 1, width, width), dtype=torch.bool)
    for r, s in enumerate(seqs):
        at = 0
        for i in s:
            n = len(ids[i])
            x[r, at : at + n] = torch.tensor(ids[i])
            pos[r, at : at + n] = torch.arange(n)
            allowed[r, 0, at : at + n, at : at + n] = torch.ones(n, n, dtype=torch.bool).tril()
            at += n
        allowed[r, 0, at:, at:] = torch.eye(width - at, dtype=torch.bool)  # padding attends to itself (no NaN)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return {"input_ids": x, "position_ids": pos, "attention_mask": mask}


@torch.no_grad()
def forward_seconds(decoder, batch) -> float:
    start = time.perf_counter()
    decoder(**batch, use_cache=False)
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="benchmarks/measurements/padding")
    p.add_argument("--work", default="/tmp/draftheads-bench-scale", help="tokenizer/target/data cache")
    p.add_argument("--rows", type=int, default=480)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--subset", type=int, default=64, help="random rows per round, run in every arrangement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    tok = make_tokenizer(work / "tokenizer")
    specials = special_strings(tok)
    ids = []
    for n, row in enumerate(chat_rows(args.rows)):
        seq, mask = tokenize_chat(tok, normalize_chat(row["conversations"], "sharegpt", n), args.max_length, specials=specials)
        ids.append(seq)
    lengths = [len(x) for x in ids]
    b = args.batch_size
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(0)).tolist()
    arrangements = {
        "random": [perm[i : i + b] for i in range(0, len(perm), b)],
        "grouped": LengthGroupedSampler(lengths, b, seed=0).batches(),
    }
    bins = pack_ffd(lengths, args.max_length)
    packs = [bins[i : i + b] for i in range(0, len(bins), b)]
    pad_fraction = {k: padding_fraction(lengths, v) for k, v in arrangements.items()}
    pad_fraction["packed"] = 1 - sum(lengths) / (len(bins) * args.max_length)
    print(f"{len(ids)} rows, tokens: median {statistics.median(lengths)}, min {min(lengths)}, max {max(lengths)}, "
          f"{sum(lengths)} in all; {sum(x == args.max_length for x in lengths)} truncated at {args.max_length}")
    for k, v in pad_fraction.items():
        print(f"padding fraction {k:8s} {v:.3f}")

    target_dir = make_target(work / f"llama-{args.layers}x{args.hidden}", tok, layers=args.layers, hidden=args.hidden)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    decoder = model.model
    pad = tok.pad_token_id
    # packing is exact: a packed row's hidden states equal the row run alone
    probe = next(b for b in bins if len(b) >= 2)[:2]
    packed = decoder(**packed_batch(ids, [probe], pad, torch.float32), use_cache=False).last_hidden_state
    alone = decoder(input_ids=torch.tensor([ids[probe[1]]]), use_cache=False).last_hidden_state
    start = len(ids[probe[0]])
    err = (packed[0, start : start + len(ids[probe[1]])] - alone[0]).abs().max().item()
    print(f"packing check: max |packed - alone| = {err:.2e}")

    rng = random.Random(0)
    seconds = {k: [] for k in ("random", "grouped", "packed")}
    real = {k: [] for k in seconds}
    forward_seconds(decoder, padded_batch(ids, arrangements["random"][0][:2], pad))  # warm-up
    for rnd in range(args.rounds):
        # The same random rows in every arrangement, so each processes the same real tokens.
        subset = rng.sample(range(len(ids)), args.subset)
        sub_lengths = [lengths[i] for i in subset]
        local = {
            "random": [list(range(i, min(i + b, len(subset)))) for i in range(0, len(subset), b)],
            "grouped": LengthGroupedSampler(sub_lengths, b, seed=rnd, group=len(subset)).batches(),
        }
        sub_bins = pack_ffd(sub_lengths, args.max_length)
        names = ["random", "grouped", "packed"]
        names = names[rnd % 3 :] + names[: rnd % 3]  # rotate the order between rounds
        for name in names:
            spent = 0.0
            if name == "packed":
                for j in range(0, len(sub_bins), b):
                    seqs = [[subset[i] for i in s] for s in sub_bins[j : j + b]]
                    spent += forward_seconds(decoder, packed_batch(ids, seqs, pad, torch.float32))
            else:
                for rows in local[name]:
                    spent += forward_seconds(decoder, padded_batch(ids, [subset[i] for i in rows], pad))
            seconds[name].append(spent)
            real[name].append(sum(sub_lengths))
        print(f"round {rnd + 1}: " + ", ".join(f"{k} {real[k][-1] / seconds[k][-1]:.0f}" for k in seconds)
              + " real tok/s", flush=True)
    rate = {k: sum(real[k]) / sum(seconds[k]) for k in seconds}
    per_round = {k: [r / s for r, s in zip(real[k], seconds[k])] for k in seconds}
    result = {
        "rows": len(ids), "max_length": args.max_length, "batch_size": b,
        "length": {"median": statistics.median(lengths), "min": min(lengths), "max": max(lengths), "total": sum(lengths)},
        "padding_fraction": pad_fraction,
        "target": f"random Llama {args.layers}x{args.hidden}, vocab {len(tok)}, fp32, sdpa, {args.threads} thread(s)",
        "real_tokens_per_second": rate,
        "per_round_real_tokens_per_second": per_round,
        "speedup_vs_random": {k: rate[k] / rate["random"] for k in rate},
        "packing_check_max_abs_err": err,
        "command": " ".join(sys.argv),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "padding.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
