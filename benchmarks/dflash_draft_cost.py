"""Draft cost of DFlash heads per decoding step, beside one target forward, interleaved.

One DFlash step drafts its whole block in one forward (whatever the chain or tree read from it);
this times that forward (the block over a cached context of ``--context`` positions, plus its
logits) and one target forward of one token over a KV cache of the same length, alternating
``--rounds`` times, and prints the medians, their ratio and the spread of the per-round ratios.

    python benchmarks/dflash_draft_cost.py --target demo --heads runs/demo-dflash/heads [--out DIR]
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
    proposer = DFlashProposer(heads)
    proposer.start(ids[0], features, SamplingParams(), None)
    slots = heads.config.num_heads
    proposer.slot_logits(0, slots)  # fills the context cache (later calls reuse it)
    one = torch.tensor([[5]])

    def target_step() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            target(one, past_key_values=cache, use_cache=True)
        cache.crop(-1)  # back to the context (transformers 5: a negative count of tokens to drop)
        return time.perf_counter() - t0

    def draft_step() -> float:
        t0 = time.perf_counter()
        proposer.slot_logits(0, slots)
        return time.perf_counter() - t0

    for _ in range(3):  # warm-up
        target_step(), draft_step()
    drafts, targets = [], []
    for r in range(args.rounds):
        first, second = (draft_step, target_step) if r % 2 == 0 else (target_step, draft_step)
        a, b = first(), second()
        d, t = (a, b) if r % 2 == 0 else (b, a)
        drafts.append(d)
        targets.append(t)
    ratios = sorted(d / t for d, t in zip(drafts, targets))
    result = {
        "block_size": heads.block_size, "draft_layers": heads.config.num_layers, "context": args.context,
        "threads": torch.get_num_threads(), "rounds": args.rounds,
        "draft_ms_median": 1e3 * statistics.median(drafts), "target_forward_ms_median": 1e3 * statistics.median(targets),
        "draft_over_target_median": statistics.median(ratios),
        "draft_over_target_p10_p90": [ratios[len(ratios) // 10], ratios[(9 * len(ratios)) // 10]],
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "draft-cost.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
