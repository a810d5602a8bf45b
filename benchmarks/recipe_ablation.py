"""Training-recipe ablation for EAGLE-3 heads on the demo target: today's recipe vs the reference
trainer's initialisation vs its initialisation and optimizer, same windows and budget.

    python benchmarks/recipe_ablation.py [--workdir /tmp/draftheads-recipe] [--steps 200] \\
        [--arms today,init,init+optim] [--out benchmarks/measurements/recipe-ablation-demo]

Each arm trains ``configs/demo-eagle3.yaml`` (the same data, seed and batches: only the recipe
options of the arm differ) into WORKDIR/runs/<arm> (skipped when its heads exist, so a killed run
continues), then every arm's heads are measured with draftheads' own decoder on the 12 held-out
demo prompts that ``draftheads bench`` uses (128 tokens of held-out stdlib files), greedy, 128 new
tokens, every output checked equal to ``target.generate(do_sample=False)`` (``--temperature T``:
lossless sampling instead, seeded per prompt, unchecked here):

- chain: EAGLE's dynamic tree cut to a chain of 5 drafts (total_tokens 6, depth 5, top_k 1):
  mean accepted tokens per step (bonus included) and how often a step reaches depth 1..5;
- tree: a 16-token dynamic tree (total_tokens 16, depth 6, top_k 4): mean accepted tokens per step
  (P-EAGLE / DFlash heads, `--config configs/demo-peagle.yaml`: the chain of 5 depths from one draft
  forward, and as the tree that chain plus each depth's second-ranked token);
- held-out top-1 per draft step: the heads unrolled 7 steps (training-time test, as drafting
  does) over the first ``--eval-batches`` x 8 held-out windows, agreement of each step's argmax with
  the target's greedy token there (what verification accepts).

No timing: acceptance counts do not depend on the machine's load. Results go to OUT/results.json
and OUT/results.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The reference EAGLE-3 trainer's recipe (SafeAILab/EAGLE eagle/traineagle3: plain nn.Linear
#: init; ds_config.json: AdamW betas (0.9, 0.95), WarmupDecayLR = linear decay, gradient_clipping 0.5;
#: cnets.Model unrolls 7 steps).
#: Every arm sets every knob, so an arm means the same whatever the config file's values are.
#: "today": draftheads' recipe before the measurement below (identity init, its optimizer).
INIT, OWN_INIT = ("heads.init=torch",), ("heads.init=identity",)
OPTIM = ("train.adam_betas=[0.9, 0.95]", "train.lr_schedule=linear", "train.max_grad_norm=0.5")
OWN_OPTIM = ("train.adam_betas=[0.9, 0.999]", "train.lr_schedule=cosine", "train.max_grad_norm=1.0")
#: Training-time-test depth: draftheads' demo unrolls 3 steps, the reference trainer 7.
TTT, OWN_TTT = ("heads.num_heads=7",), ("heads.num_heads=3",)
#: The per-step loss (`heads.loss`) and the weight of draft step k (`train.loss_decay` ** k).
LOSS = ("heads.loss=soft_ce", "train.loss_decay=0.8")
ARMS: dict[str, tuple[str, ...]] = {
    "today": OWN_INIT + OWN_OPTIM + OWN_TTT + LOSS,
    "init": INIT + OWN_OPTIM + OWN_TTT + LOSS,
    "optim": OWN_INIT + OPTIM + OWN_TTT + LOSS,
    "init+optim": INIT + OPTIM + OWN_TTT + LOSS,
    "init+ttt7": INIT + OWN_OPTIM + TTT + LOSS,
    "init+optim+ttt7": INIT + OPTIM + TTT + LOSS,
    # The loss knobs, each one change from the shipped demo recipe (= "init"):
    "loss=kl": INIT + OWN_OPTIM + OWN_TTT + ("heads.loss=kl", "train.loss_decay=0.8"),
    "loss=ce": INIT + OWN_OPTIM + OWN_TTT + ("heads.loss=ce", "train.loss_decay=0.8"),
    "loss=lk": INIT + OWN_OPTIM + OWN_TTT + ("heads.loss=lk", "train.loss_decay=0.8"),
    "decay=1.0": INIT + OWN_OPTIM + OWN_TTT + ("heads.loss=soft_ce", "train.loss_decay=1.0"),
    # A second training seed (initialisation and batch order; the same files) for the two that differed most
    "init@seed1": INIT + OWN_OPTIM + OWN_TTT + LOSS + ("train.seed=1",),
    "loss=ce@seed1": INIT + OWN_OPTIM + OWN_TTT + ("heads.loss=ce", "train.loss_decay=0.8", "train.seed=1"),
    # EAGLE 3.1 (`heads.fc_norm`, `heads.norm_output`), one change from the shipped recipe, two seeds
    "eagle3.1": INIT + OWN_OPTIM + OWN_TTT + LOSS + ("heads.fc_norm=true", "heads.norm_output=true"),
    "eagle3.1@seed1": INIT + OWN_OPTIM + OWN_TTT + LOSS + ("heads.fc_norm=true", "heads.norm_output=true", "train.seed=1"),
}
# Two more seeds of the shipped recipe and of EAGLE 3.1 (their first two seeds disagreed: chain 1.38 vs 3.41)
for _seed in (2, 3):
    ARMS[f"init@seed{_seed}"] = INIT + OWN_OPTIM + OWN_TTT + LOSS + (f"train.seed={_seed}",)
    ARMS[f"eagle3.1@seed{_seed}"] = ARMS["eagle3.1"] + (f"train.seed={_seed}",)
# EAGLE 3.1 with its own LM head started from the target's rows (`heads.lm_head_init=target`), four seeds
LM_HEAD = ("heads.lm_head_init=target",)
ARMS["eagle3.1+lm_head"] = ARMS["eagle3.1"] + LM_HEAD
for _seed in (1, 2, 3):
    ARMS[f"eagle3.1+lm_head@seed{_seed}"] = ARMS["eagle3.1"] + LM_HEAD + (f"train.seed={_seed}",)
# P-EAGLE (`--config configs/demo-peagle.yaml`): its shipped recipe with and without the same start
DISTILLED = ("data.path=demo-distilled", "data.eval_path=demo", "data.max_samples=null", "data.chunk_text=false")
for _seed in (0, 1):
    _at = f"@seed{_seed}" if _seed else ""
    ARMS[f"peagle{_at}"] = (f"train.seed={_seed}",)
    ARMS[f"peagle+lm_head{_at}"] = LM_HEAD + (f"train.seed={_seed}",)
    ARMS[f"peagle+norm_before_fc{_at}"] = ("heads.norm_before_fc=true", f"train.seed={_seed}")  # speculators' default
    # the feature layers demo-eagle3 takes (3, 5, 7 of 8; EAGLE-3's rule gives 2, 4, 5)
    ARMS[f"peagle+layers357{_at}"] = ("heads.feature_layers=[3,5,7]", f"train.seed={_seed}")
    # the data demo-eagle and demo-eagle3 train on: the corpus continued by the demo target
    ARMS[f"peagle+distilled{_at}"] = DISTILLED + (f"train.seed={_seed}",)
CHAIN = {"total_tokens": 6, "depth": 5, "top_k": 1}
TREE = {"total_tokens": 16, "depth": 6, "top_k": 4}
EVAL_STEPS = 7


def train_arm(workdir: Path, arm: str, steps: int, warmup: int | None, config: Path) -> dict:
    """Train one arm in this process (skipped when its heads exist). Mid-run evaluations,
    checkpoints and the export's tree timing are off: this benchmark decodes with fixed shapes,
    and on a loaded machine the timing grid costs more than the training."""
    from draftheads.config import load_config
    from draftheads.train import loop

    out = workdir / "runs" / arm
    info_file = out / "train-info.json"
    if (out / "heads" / "config.json").is_file() and info_file.is_file():
        return json.loads(info_file.read_text())
    overrides = [f"train.output_dir={out}", f"train.max_steps={steps}", "train.eval_every=0", "train.save_every=0",
                 "train.choose_tree=false", *([f"train.warmup_steps={warmup}"] if warmup is not None else []),
                 *ARMS[arm]]  # fmt: skip
    print(f"+ {arm}: {config} {' '.join(overrides)}", flush=True)
    start = time.perf_counter()
    result = loop.run(load_config(config, overrides), overwrite=True)
    info = {"config": str(config), "overrides": overrides, "train_seconds": time.perf_counter() - start,
            "final_eval": {k: v for k, v in result.metrics["final_eval"].items() if isinstance(v, (int, float))}}
    info_file.write_text(json.dumps(info, indent=2))
    return info


def prompts(tokenizer, num: int) -> list[torch.Tensor]:
    from draftheads.bench.questions import demo_questions

    return [tokenizer(q.turns[0], return_tensors="pt").input_ids for q in demo_questions(tokenizer, num)]


@torch.no_grad()
def decode_stats(target, heads_dir: Path, prompt_ids: list[torch.Tensor], references: list[torch.Tensor] | None,
                 new_tokens: int, temperature: float = 0.0) -> dict:
    """Mean accepted tokens per step for the chain and the tree, and the chain's reach per depth.
    ``temperature`` > 0: lossless sampling (one seed per prompt, the target's other sampling
    settings as its generation config says); no reference to compare with then (tests/test_sampling.py
    checks the law), and the figures carry the draws' noise."""
    from draftheads import load_heads
    from draftheads.inference import SpeculativeDecoder

    heads = load_heads(heads_dir, target=target)
    shapes = (("chain", CHAIN), ("tree", TREE))
    if heads.head_type in ("peagle", "dflash"):  # one draft forward: rank paths of its per-depth top-k
        depth = CHAIN["depth"]
        shapes = (("chain", [[0] * d for d in range(1, depth + 1)]),
                  ("tree", [[0] * (d - 1) + [r] for d in range(1, depth + 1) for r in (0, 1)]))  # fmt: skip
    result = {}
    for name, shape in shapes:
        # draft_budget=None: the online budget caps drafts by measured seconds, which would make an
        # acceptance figure follow the machine's load instead of the heads.
        decoder = SpeculativeDecoder(target, heads, tree=shape, draft_budget=None)
        lengths: list[int] = []
        per_prompt: list[float] = []  # each prompt's mean: a paired comparison between heads
        for i, ids in enumerate(prompt_ids):
            out = decoder.generate(ids, max_new_tokens=new_tokens, temperature=temperature,
                                   seed=i if temperature > 0 else None)  # EOS as generate's
            if references is not None and not torch.equal(out.sequences.cpu(), references[i]):
                raise AssertionError(f"{heads_dir} ({name}): output differs from target.generate on a prompt")
            lengths += list(out.accept_lengths)
            per_prompt.append(sum(out.accept_lengths) / len(out.accept_lengths))
        steps = len(lengths)
        result[name] = {"mean_accepted": sum(lengths) / steps, "steps": steps, "per_prompt": per_prompt}
        if name == "chain":  # a step that accepted d drafts commits d + 1 tokens
            result[name]["reach"] = [sum(n - 1 >= d for n in lengths) / steps for d in range(1, CHAIN["depth"] + 1)]
    return result


def heldout_windows(tokenizer, config: Path, eval_batches: int):
    """The config, and the first ``eval_batches`` batches of its held-out windows (as training evaluates)."""
    from draftheads.config import load_config
    from draftheads.data import build_datasets

    cfg = load_config(config)
    _, eval_ds, _ = build_datasets(cfg.data, tokenizer)
    return cfg, eval_ds.select(range(min(len(eval_ds), eval_batches * cfg.train.batch_size)))


@torch.no_grad()
def heldout_top1(target, tokenizer, heads_dir: Path, cfg, eval_ds) -> dict:
    """Held-out top-1 (vs the target's greedy token) and soft CE per draft step, 7 steps unrolled
    (soft CE for every arm, whichever `heads.loss` it trained with)."""
    from draftheads import load_heads
    from draftheads.data import Collator
    from draftheads.train.metrics import HeadStats
    from draftheads.train.model import TargetWithHeads

    heads = load_heads(heads_dir, target=target)
    heads.config.num_heads = EVAL_STEPS  # steps unrolled: no tensor depends on it
    heads.config.extra["loss"] = "soft_ce"  # one held-out loss for every arm, whatever it trained with
    model = TargetWithHeads(target, heads, loss_decay=cfg.train.loss_decay, labels=cfg.train.labels).eval()
    collate = Collator.from_tokenizer(tokenizer)
    stats = HeadStats(EVAL_STEPS)
    n, size = len(eval_ds), cfg.train.batch_size
    for start in range(0, n, size):
        stats.add(model(**collate([eval_ds[i] for i in range(start, min(n, start + size))]))["stats"])
    summary = stats.summary(5)
    return {
        "windows": n,
        "top1": [summary[f"top1_head{k}"] for k in range(EVAL_STEPS)],
        "loss": [summary[f"loss_head{k}"] for k in range(EVAL_STEPS)],
    }


def table(results: dict, steps: int) -> str:
    lines = [
        f"| EAGLE-3 heads, {steps} steps, recipe | 16-token tree: mean accepted | 5-token chain: mean accepted "
        "| chain reaches depth 1 / 2 / 3 / 4 / 5 | held-out top-1 at draft step 0 / 2 / 6 | held-out loss step 0 / 2 / 6 "
        "| decode steps (chain / tree) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, r in results.items():
        reach = " ".join(f"{x:.2f}" for x in r["chain"]["reach"])
        held = r["heldout"]
        top1 = " / ".join(f"{held['top1'][k]:.3f}" for k in (0, 2, 6)) if held else "-"
        loss = " / ".join(f"{held['loss'][k]:.2f}" for k in (0, 2, 6)) if held else "-"
        lines.append(
            f"| {arm} (`{' '.join(ARMS[arm])}`) | {r['tree']['mean_accepted']:.2f} "
            f"| **{r['chain']['mean_accepted']:.2f}** | {reach} | {top1} | {loss} "
            f"| {r['chain']['steps']} / {r['tree']['steps']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default="/tmp/draftheads-recipe")
    ap.add_argument("--config", default=str(ROOT / "configs" / "demo-eagle3.yaml"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=None, help="train.warmup_steps (default: the config's)")
    ap.add_argument("--arms", default="today,init,init+optim", help=f"comma-separated, of: {', '.join(ARMS)}")
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--eval-batches", type=int, default=20, help="held-out batches of 8 windows for top-1 per step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--train-only", action="store_true", help="train the arms, measure nothing")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="decode by lossless sampling at this temperature (0: greedy, checked equal to generate)")
    ap.add_argument("--skip-heldout", action="store_true", help="decode only (no held-out top-1 per step)")
    ap.add_argument("--out", default=None, help="folder for results.json and results.md")
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {', '.join(unknown)}; valid: {', '.join(ARMS)}")
    workdir, config = Path(args.workdir), Path(args.config)

    torch.set_num_threads(args.threads)
    os.environ.setdefault("DRAFTHEADS_NUM_THREADS", str(args.threads))  # what run() uses on CPU
    infos = {arm: train_arm(workdir, arm, args.steps, args.warmup, config) for arm in arms}

    if args.train_only:
        return
    from draftheads.target import load_target

    target, tokenizer = load_target("demo")
    prompt_ids = prompts(tokenizer, args.num_prompts)
    references = None if args.temperature > 0 else [
        target.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=args.new_tokens)
        for p in prompt_ids
    ]  # fmt: skip
    cfg, eval_ds = (None, None) if args.skip_heldout else heldout_windows(tokenizer, config, args.eval_batches)
    results = {}
    for arm in arms:
        heads_dir = workdir / "runs" / arm / "heads"
        results[arm] = {
            **decode_stats(target, heads_dir, prompt_ids, references, args.new_tokens, args.temperature),
            "heldout": None if args.skip_heldout else heldout_top1(target, tokenizer, heads_dir, cfg, eval_ds),
            "overrides": list(ARMS[arm]),
            "train_seconds": infos[arm].get("train_seconds"),
        }
        print(arm, json.dumps({k: results[arm][k] for k in ("chain", "tree")}), flush=True)
    md = table(results, args.steps)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"steps": args.steps, "prompts": len(prompt_ids), "new_tokens": args.new_tokens,
                "temperature": args.temperature, "chain": CHAIN,
                "tree": TREE, "eval_steps": EVAL_STEPS, "command": " ".join(sys.argv)}  # fmt: skip
        (out / "results.json").write_text(json.dumps({**meta, "arms": results}, indent=2))
        (out / "results.md").write_text(f"`{meta['command']}`\n\n" + md)


if __name__ == "__main__":
    main()
