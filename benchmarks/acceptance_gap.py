"""Why heads accept less when decoding than their training metrics say: on the same texts, the
teacher-forced top-1 per draft step (the metric training prints) beside what decoding accepts.

    python benchmarks/acceptance_gap.py --heads runs/smollm2/heads \\
        --questions mt-bench --questions unused:configs/smollm2.yaml [--num-prompts 12] [--new-tokens 96]
        [--out results/acceptance-gap]

For each prompt set: the target's greedy answer to each first turn (``--new-tokens`` tokens), then
- decoded: the heads alone (no prompt lookup, no draft budget, no plan) draft a 5-token chain and a
  16-token tree (``reference_eagle3.measure.decode_stats``; every output checked equal to
  ``target.generate``): mean tokens per step, and the chain's reach, the share of steps accepting
  at least d drafts;
- teacher-forced: the heads' top-1 against the target's token at each of 7 unrolled draft steps,
  over every answer position of the same texts (``reference_eagle3.measure.heldout_top1``).

Two gaps show. Between prompt sets: the same heads on prompts like their training chats and on
others. Within a set: a decoded step lands where the last one stopped, so it jumps through easy
stretches in few steps and spends its steps where drafts fail; the share of steps accepting a draft
is below the share of positions the heads predict (a sampling effect, not a difference between
training and decoding).

``unused:CONFIG`` is the first user turns of the config's ``data.path`` rows that its
``data.max_samples`` shuffle did not select: chats from the training distribution the heads never saw.
No timing: the figures do not depend on the machine's load.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "reference_eagle3"))
from measure import decode_stats, heldout_top1  # noqa: E402
from prompts import DEFAULT_TARGET, load_prompts  # noqa: E402


def unused_chats(config_path: str, folder: Path) -> str:
    """A questions file of the first user turns of ``config_path``'s training rows that its
    ``max_samples`` shuffle left out (the shuffle training applies, `data.tokenize`, on row numbers)."""
    import datasets

    from draftheads.config import load_config

    cfg = load_config(config_path)
    if cfg.data.max_samples is None:
        raise SystemExit(f"unused:{config_path}: the config reads every row of {cfg.data.path} (no data.max_samples)")
    rows = [json.loads(line) for line in Path(cfg.data.path).read_text().splitlines() if line.strip()]
    numbers = datasets.Dataset.from_dict({"row": list(range(len(rows)))})
    used = set(numbers.shuffle(seed=cfg.data.seed).select(range(cfg.data.max_samples))["row"])
    out = folder / "unused.jsonl"
    with out.open("w") as f:
        for i, row in enumerate(rows):
            user = next((m["content"] for m in row.get("messages", []) if m["role"] == "user"), None)
            if i not in used and user:
                f.write(json.dumps({"question_id": f"row-{i}", "category": "unused", "turns": [user]}) + "\n")
    return str(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", required=True)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--questions", action="append", required=True,
                   help="repeatable: a question set or file (as the other scripts), or unused:CONFIG")
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--config", default="configs/smollm2.yaml", help="train.loss_decay/labels/batch_size for the top-1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="folder for results.json")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from draftheads.config import load_config
    from draftheads.target import load_target

    cfg = load_config(args.config)
    target, tokenizer = load_target(args.target, device=torch.device("cpu"), dtype="float32")
    results = {"heads": args.heads, "new_tokens": args.new_tokens, "sets": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.questions:
            source = unused_chats(name.split(":", 1)[1], Path(tmp)) if name.startswith("unused:") else name
            prompts = load_prompts(tokenizer, source, args.num_prompts)
            with torch.no_grad():
                texts = [target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                         max_new_tokens=args.new_tokens) for ids in prompts]
            decoded = decode_stats(target, Path(args.heads), prompts, texts, args.new_tokens)
            examples = [{"input_ids": text[0].tolist(),
                         "loss_mask": [0] * ids.shape[1] + [1] * (text.shape[1] - ids.shape[1])}
                        for ids, text in zip(prompts, texts)]
            forced = heldout_top1(target, tokenizer, Path(args.heads), cfg, examples)
            results["sets"][name] = {
                "prompts": len(prompts),
                "decoded_chain_mean": decoded["chain"]["mean_accepted"], "decoded_chain_reach": decoded["chain"]["reach"],
                "decoded_tree_mean": decoded["tree"]["mean_accepted"], "teacher_forced_top1": forced["top1"],
            }
            r = results["sets"][name]
            print(f"{name}: decoded chain {r['decoded_chain_mean']:.3f} reach "
                  f"{'/'.join(f'{x:.3f}' for x in r['decoded_chain_reach'])}, tree {r['decoded_tree_mean']:.3f}; "
                  f"teacher-forced top-1 {'/'.join(f'{x:.3f}' for x in r['teacher_forced_top1'])}", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "summary.md").write_text(summary(results, " ".join(sys.argv)))


def summary(results: dict, command: str) -> str:
    lines = [f"command: `python {command}`", "",
             f"The target's greedy answers ({results['new_tokens']} tokens) to each set's first turns; decoded by "
             "the heads alone (every output equal to `generate`) and scored teacher-forced on the same texts.", "",
             "| prompts | decoded: tokens/step, 5-chain | share of steps accepting >= 1/2/3 drafts | 16-token tree "
             "| teacher-forced top-1, draft steps 1/2/3 |", "|---|---|---|---|---|"]
    for name, r in results["sets"].items():
        lines.append(f"| {name} ({r['prompts']}) | {r['decoded_chain_mean']:.3f} | "
                     f"{'/'.join(f'{x:.3f}' for x in r['decoded_chain_reach'][:3])} | {r['decoded_tree_mean']:.3f} | "
                     f"{'/'.join(f'{x:.3f}' for x in r['teacher_forced_top1'][:3])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
