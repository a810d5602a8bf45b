"""What every arm of the side-by-side run is measured with: draftheads' own decoder on held-out
prompts (a chain and a tree, every greedy output checked equal to ``target.generate``) and held-out
top-1 per unrolled draft step. Also the draftheads-side recipe arms (``draftheads:<arm>``).
No timing: acceptance counts do not depend on the machine's load.
"""
from __future__ import annotations

from pathlib import Path

import torch

#: The reference trainer's recipe knobs as draftheads overrides (SafeAILab/EAGLE eagle/traineagle3:
#: plain nn.Linear init; ds_config.json: AdamW betas (0.9, 0.95), linear decay, gradient clipping 0.5;
#: cnets.Model unrolls 7 steps). Every arm sets every knob, so an arm means the same whatever the
#: config's values are.
INIT, OWN_INIT = ("heads.init=torch",), ("heads.init=identity",)
OPTIM = ("train.adam_betas=[0.9, 0.95]", "train.lr_schedule=linear", "train.max_grad_norm=0.5")
OWN_OPTIM = ("train.adam_betas=[0.9, 0.999]", "train.lr_schedule=cosine", "train.max_grad_norm=1.0")
TTT, OWN_TTT = ("heads.num_heads=7",), ("heads.num_heads=3",)
ARMS: dict[str, tuple[str, ...]] = {
    "identity": OWN_INIT + OWN_OPTIM + OWN_TTT,
    "init": INIT + OWN_OPTIM + OWN_TTT,
    "optim": OWN_INIT + OPTIM + OWN_TTT,
    "init+optim": INIT + OPTIM + OWN_TTT,
    "init+ttt7": INIT + OWN_OPTIM + TTT,
    "init+optim+ttt7": INIT + OPTIM + TTT,
}
CHAIN = {"total_tokens": 6, "depth": 5, "top_k": 1}
TREE = {"total_tokens": 16, "depth": 6, "top_k": 4}
EVAL_STEPS = 7


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
        # prompt_lookup=False: the heads alone; a plan that puts prompt lookup in front would count its copies too.
        decoder = SpeculativeDecoder(target, heads, tree=shape, draft_budget=None, prompt_lookup=False)
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
