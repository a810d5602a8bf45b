"""Draft cost of DFlash heads per decoding step, beside one target forward, interleaved.

One DFlash step drafts its whole block in one forward (whatever the chain or tree read from it);
this times that forward (the block over a cached context of ``--context`` positions, plus its
logits) and one target forward of one token over a KV cache of the same length, alternating
``--rounds`` times, and prints the medians, their ratio and the spread of the per-round ratios.

    python benchmarks/dflash_draft_cost.py --target demo --heads runs/demo-dflash/heads [--out DIR] \
        [--draft-vocab-size none --draft-vocab-size 1024 ...]

``--draft-vocab-size`` (repeatable; ``none`` = the whole vocabulary): each draft vocabulary's
block forward is timed in the same rounds (order rotated per round), each against its own target
forward; without it, the heads' own (calibrated) vocabulary.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--heads", required=True)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default=None, help="folder for result.json")
    parser.add_argument("--draft-vocab-size", action="append", default=None,
                        help="repeatable: 'none' (whole vocabulary) or N (the N most frequent training tokens)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import draftheads as dh
    from draftheads.config import TargetConfig
    from draftheads.inference.proposers.dflash import DFlashProposer
    from draftheads.inference.sampling import SamplingParams
    from draftheads.train.loop import load_target

    target, _ = load_target(TargetConfig(name_or_path=args.target, dtype="float32"))
    heads = dh.load_heads(args.heads, target=target)
    ids = torch.randint(3, heads.config.vocab_size, (1, args.context))
    with torch.no_grad():
        cache = DynamicCache()
        out = target(ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
        features = torch.cat([out.hidden_states[i] for i in heads.feature_layers], dim=-1)[0]
    labels = args.draft_vocab_size or [None]
    proposers = {}
    for label in labels:
        size = None if label is None else heads.config.vocab_size if label == "none" else int(label)
        proposers[label] = DFlashProposer(heads, draft_vocab_size=size)
        proposers[label].start(ids[0], features, SamplingParams(), None)
    slots = heads.config.num_heads
    for proposer in proposers.values():
        proposer.slot_logits(0, slots)  # fills the context cache (later calls reuse it)
    one = torch.tensor([[5]])

    def target_step() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            target(one, past_key_values=cache, use_cache=True)
        cache.crop(-1)  # back to the context (transformers 5: a negative count of tokens to drop)
        return time.perf_counter() - t0

    def draft_step(proposer) -> float:
        t0 = time.perf_counter()
        proposer.slot_logits(0, slots)
        return time.perf_counter() - t0

    for _ in range(3):  # warm-up
        target_step(), [draft_step(p) for p in proposers.values()]
    drafts = {label: [] for label in labels}
    targets = {label: [] for label in labels}
    for r in range(args.rounds):
        order = labels[r % len(labels):] + labels[: r % len(labels)]
        for label in order:  # each draft beside its own target forward, the draft first every other round
            if r % 2 == 0:
                d = draft_step(proposers[label])
                t = target_step()
            else:
                t = target_step()
                d = draft_step(proposers[label])
            drafts[label].append(d)
            targets[label].append(t)

    def summary(label) -> dict:
        ratios = sorted(d / t for d, t in zip(drafts[label], targets[label]))
        return {
            "draft_vocab_size": proposers[label].draft_vocab_size if label is None else label,
            "draft_ms_median": 1e3 * statistics.median(drafts[label]),
            "target_forward_ms_median": 1e3 * statistics.median(targets[label]),
            "draft_over_target_median": statistics.median(ratios),
            "draft_over_target_p10_p90": [ratios[len(ratios) // 10], ratios[(9 * len(ratios)) // 10]],
        }

    result = {
        "block_size": heads.block_size, "draft_layers": heads.config.num_layers, "context": args.context,
        "threads": torch.get_num_threads(), "rounds": args.rounds,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else None,
    }
    if args.draft_vocab_size:
        result["by_draft_vocab_size"] = [summary(label) for label in labels]
    else:
        result.update(summary(None))
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "draft-cost.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
