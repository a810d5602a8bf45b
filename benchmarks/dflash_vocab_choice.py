"""What training's tree choice (`tune.training.choose_block_tree`) picks for trained DFlash heads,
draft vocabularies included, on this machine: the heads' saved greedy acceptance table (tree.json
``measured.accuracy``) scaled per draft vocabulary by the hits it keeps on the demo's held-out
prompts, and the verify / draft times measured here. Prints each candidate's expected speedup.

    python benchmarks/dflash_vocab_choice.py --heads runs/demo-dflash/heads [--prompts 8] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="demo")
    parser.add_argument("--heads", required=True)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="file for the result (json)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import draftheads as dh
    import draftheads.tune.training as training
    from draftheads.bench.questions import demo_questions
    from draftheads.config import TargetConfig
    from draftheads.train.loop import load_target

    target, tokenizer = load_target(TargetConfig(name_or_path=args.target, dtype="float32"))
    heads = dh.load_heads(args.heads, target=target)
    table = torch.tensor(heads.plans.entries[0].measured["accuracy"], dtype=torch.float32)
    rows = [tokenizer(q.turns[0], return_tensors="pt").input_ids[0] for q in demo_questions(tokenizer, args.prompts)]
    candidates = []
    choose_tree = training.choose_tree

    def recording(acc, verify, draft, **kwargs):  # every size's best tree, not only the winner
        result = choose_tree(acc, verify, draft, **kwargs)
        candidates.append({"expected_tokens_per_step": result.expected_tokens_per_step,
                           "expected_speedup": result.expected_speedup, "tree_nodes": len(result.tree) + 1,
                           "draft_ms": 1e3 * draft[1]})
        return result

    training.choose_tree = recording
    chosen = training.choose_block_tree(target, heads, table, rows)
    sizes = training.one_forward_vocab_sizes(heads, training.VOCAB_SIZES)
    result = {"heads": args.heads, "chosen_draft_vocab_size": chosen["draft_vocab_size"], "chosen_tree": chosen["tree"],
              "candidates": [{"draft_vocab_size": s, **c} for s, c in zip(sizes, candidates)],
              "loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
