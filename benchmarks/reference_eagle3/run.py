"""Side by side: the EAGLE-3 authors' trainer (SafeAILab/EAGLE, eagle/traineagle3) against
draftheads (an EAGLE-3 config: ``--config``, default configs/smollm2-eagle3.yaml) on that config's
target, the same token windows in the same batches, both sets of heads decoded by draftheads' own
decoder.

    python benchmarks/reference_eagle3/run.py --eagle /path/to/EAGLE[.git] [--commit cb7e084] \\
        [--config configs/smollm2-eagle3.yaml] [--questions mt-bench] [--workdir runs/reference-eagle3] \\
        [--steps 200] [--arms reference,draftheads] [--out results/reference-eagle3]

``--eagle`` is a checkout of SafeAILab/EAGLE or a bare git directory of it (then ``--commit`` is
exported with ``git archive`` into WORKDIR/src-<commit>). Nothing of it is copied into draftheads:
this script imports its ``cnets.Model`` (draft layer, fc, norm, LM head, data preparation, the
7-step training-time-test unroll and the loss) and its ``configs.EConfig`` unmodified, and
replaces only the plumbing it cannot run here:

- DeepSpeed (engine, fp16 loss scaling, ZeRO, FusedAdam, WarmupDecayLR) -> a plain fp32 loop on
  CPU: ``torch.optim.AdamW`` with ds_config.json's betas (0.9, 0.95), eps 1e-8, weight decay 0,
  gradient clipping 0.5, and DeepSpeed's own WarmupDecayLR (its default *log* warmup, then a
  straight line to zero at the last step) at the config's ``train.lr`` and ``--warmup`` steps;
- its target copy (modeling_llama_kv, which no longer builds under today's transformers) -> the
  config's target itself, returning what modeling_llama_kv returns: the inputs of layers 2, L//2 and
  L-3 (its own selection rule) and the logits;
- the embedding read from a sharded checkpoint index -> a copy of
  the target's embedding, frozen as the reference freezes it;
- the draft vocabulary scan of a ShareGPT json (``scandata``) -> the same count (its
  ``process_data``: loss-masked input tokens) over draftheads' training windows, the most frequent
  ``draft_vocab_size`` sorted by id, written to the ``cache.pt`` that ``scandata`` then loads.

The batches: draftheads' data pipeline (``build_datasets`` on the config), in the
order draftheads' loop draws them (``EpochShuffleSampler`` seeded with train.seed), collated by
draftheads' ``Collator``. The reference's trained weights are written in its own release layout
(``midlayer.*``, ``fc``, ``norm``, ``lm_head``, ``d2t``, ``t2d``) and imported through draftheads'
EAGLE-3 importer; the script checks that the imported heads, unrolled 7 steps by draftheads'
training graph, reproduce the reference model's own logits on held-out windows (max abs
difference printed and stored).

Then every arm is measured with measure.py (this folder): 12 prompts (benchmarks/prompts.py: the
first turns of ``--questions``), greedy, 128 new tokens, every output equal to
``target.generate(do_sample=False)``; a 5-token chain, a 16-token tree, held-out top-1 per draft
step. Arms: see ``REFERENCE_ARMS`` and measure.py's ``ARMS`` (trained with draftheads, prefixed
``draftheads:``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import measure  # noqa: E402  (this folder's decoder measurements and draftheads-side arms)
from prompts import add_questions_argument, load_prompts  # noqa: E402  (benchmarks/prompts.py: the prompts every script decodes)

CONFIG = ROOT / "configs" / "smollm2-eagle3.yaml"
#: The reference's optimizer (ds_config.json) and draftheads' defaults.
REFERENCE_OPTIM = {"betas": (0.9, 0.95), "schedule": "warmup-decay-log", "clip": 0.5}
DRAFTHEADS_OPTIM = {"betas": (0.9, 0.999), "schedule": "cosine", "clip": 1.0}
#: Reference arms: its model and loss unmodified; what an arm changes is named.
#: ttt: ``Model.length`` (the reference hard-codes 7 unrolled steps).
REFERENCE_ARMS: dict[str, dict] = {
    "reference": {**REFERENCE_OPTIM, "ttt": 7},
    "reference+linear-warmup": {**REFERENCE_OPTIM, "schedule": "warmup-decay-linear", "ttt": 7},
    "reference+draftheads-optim": {**DRAFTHEADS_OPTIM, "ttt": 7},
    "reference+ttt3": {**REFERENCE_OPTIM, "ttt": 3},
}


# -- the reference's source ----------------------------------------------------------------------
def reference_source(eagle: Path, commit: str | None, workdir: Path) -> tuple[Path, str]:
    """The folder holding eagle/traineagle3 (cnets.py, configs.py) and the commit it is."""
    eagle = eagle.resolve()
    is_git_dir = (eagle / "objects").is_dir() and (eagle / "HEAD").is_file()
    if is_git_dir or (eagle / ".git").exists():
        git = ["git", f"--git-dir={eagle if is_git_dir else eagle / '.git'}"]
        sha = subprocess.check_output(git + ["rev-parse", f"{commit or 'HEAD'}^{{commit}}"], text=True).strip()
        if not is_git_dir and commit is None:  # a checkout, used as it is
            return eagle / "eagle" / "traineagle3", sha
        dest = workdir / f"src-{sha[:7]}"
        if not (dest / "eagle" / "traineagle3" / "cnets.py").is_file():
            dest.mkdir(parents=True, exist_ok=True)
            archive = subprocess.run(git + ["archive", sha, "eagle/traineagle3"], check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
        return dest / "eagle" / "traineagle3", sha
    src = eagle / "eagle" / "traineagle3" if (eagle / "eagle").is_dir() else eagle
    if not (src / "cnets.py").is_file():
        raise SystemExit(f"--eagle {eagle}: no eagle/traineagle3/cnets.py there (a SafeAILab/EAGLE checkout or git dir)")
    return src, "unknown (a plain folder)"


def import_reference(src: Path):
    """The reference's cnets and configs modules, imported from ``src`` as they are."""
    sys.path.insert(0, str(src))
    import cnets  # noqa: F401
    import configs

    return cnets, configs


# -- the plumbing replaced -----------------------------------------------------------------------
class ReferenceTargetView(nn.Module):
    """What the reference's ``dataprepare`` reads from its target (``modeling_llama_kv``): the
    inputs of layers 2, L//2 and L-3, in layer order, as ``hidden_states``, and the logits."""

    def __init__(self, target: nn.Module) -> None:
        super().__init__()
        self.model = target
        n = int(target.config.num_hidden_layers)
        self.layers = [i for i in range(n) if i in (2, n // 2, n - 3)]  # modeling_llama_kv's rule

    @torch.no_grad()
    def forward(self, input_ids, attention_mask=None):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return SimpleNamespace(hidden_states=tuple(out.hidden_states[i] for i in self.layers), logits=out.logits)


def draft_vocab_cache(cnets, train_ds, vocab_size: int, n: int, path: Path) -> None:
    """``cache.pt`` as the reference's ``scandata`` writes it, counted by its ``process_data``
    (loss-masked input tokens) over the training windows."""
    chunk = {"input_ids": [[list(map(int, ex["input_ids"]))] for ex in train_ds],
             "loss_mask": [[list(map(int, ex["loss_mask"]))] for ex in train_ds]}  # fmt: skip
    counts: Counter = cnets.merge_dicts([cnets.process_data(chunk)])
    used = sorted(key for key, _ in counts.most_common(n))
    d2t = torch.tensor([used[i] - i for i in range(len(used))])
    chosen = set(used)
    t2d = torch.tensor([i in chosen for i in range(vocab_size)])
    torch.save({"d2t": d2t, "t2d": t2d}, path)


def build_reference_model(cnets, configs, target, train_ds, draft_vocab: int, ttt: int, workdir: Path, seed: int):
    """``cnets.Model`` on the target, initialised by its own constructor (plain nn.Linear)."""
    cfg = target.config
    econfig = configs.EConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=1, num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        hidden_act=cfg.hidden_act, max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        pad_token_id=cfg.pad_token_id, draft_vocab_size=draft_vocab, rope_scaling=None, pretraining_tp=1,
    )  # fmt: skip
    # transformers 5 rewrites rope_scaling=None into {"rope_type": "default", ...} (no scaling);
    # the reference reads None as "no scaling" and indexes any dict by "type": give it its None back.
    econfig.rope_scaling = None
    view = ReferenceTargetView(target)
    shim = SimpleNamespace(from_pretrained=lambda path, torch_dtype=None: view)  # fp32: the target as loaded
    original = cnets.LlamaForCausalLM
    cnets.LlamaForCausalLM = shim
    torch.manual_seed(seed)
    try:
        model = cnets.Model(econfig, None, SimpleNamespace(gradient_checkpointing=False, max_len=2048),
                            load_head=False, load_emb=False, path="target")  # fmt: skip
    finally:
        cnets.LlamaForCausalLM = original
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    model.embed_tokens.weight.requires_grad_(False)
    workdir.mkdir(parents=True, exist_ok=True)
    cache = workdir / "cache.pt"
    draft_vocab_cache(cnets, train_ds, cfg.vocab_size, draft_vocab, cache)
    cwd = os.getcwd()
    os.chdir(workdir)  # scandata loads ./cache.pt
    try:
        model.scandata(None, None)
    finally:
        os.chdir(cwd)
    model.length = ttt
    return model


def build_schedule(optimizer, schedule: str, warmup: int, total: int, lr: float):
    """The reference's scheduler is DeepSpeed's own ``WarmupDecayLR`` class (ds_config.json's;
    ``warmup_type`` log is its default), stepped after every optimizer step as DeepSpeed's engine
    steps it; "cosine" is draftheads' default (transformers' cosine with linear warmup)."""
    if schedule in ("warmup-decay-log", "warmup-decay-linear"):
        from deepspeed.runtime.lr_schedules import WarmupDecayLR

        return WarmupDecayLR(optimizer, total_num_steps=total, warmup_min_lr=0.0, warmup_max_lr=lr,
                             warmup_num_steps=warmup, warmup_type=schedule.rsplit("-", 1)[1])  # fmt: skip
    if schedule == "cosine":
        from transformers import get_cosine_schedule_with_warmup

        return get_cosine_schedule_with_warmup(optimizer, warmup, total)
    raise ValueError(f"unknown schedule {schedule!r}")


def training_batches(cfg, tokenizer, train_ds, steps: int):
    """The batches draftheads' loop trains on, in its order (one epoch's seeded permutation,
    then the next's)."""
    from draftheads.data import Collator
    from draftheads.train.step import EpochShuffleSampler

    collate, size = Collator.from_tokenizer(tokenizer), cfg.train.batch_size
    sampler, epoch, done = EpochShuffleSampler(len(train_ds), seed=cfg.train.seed), 0, 0
    while done < steps:
        sampler.set_epoch(epoch)
        order = list(sampler)
        for start in range(0, len(order), size):
            if done == steps:
                return
            yield collate([train_ds[i] for i in order[start : start + size]])
            done += 1
        epoch += 1


def train_reference(cnets, configs, target, tokenizer, cfg, train_ds, arm: str, steps: int, warmup: int,
                    workdir: Path) -> dict:
    """Train one reference arm with the plain loop that replaces DeepSpeed; returns its info."""
    spec = REFERENCE_ARMS[arm]
    model = build_reference_model(cnets, configs, target, train_ds, cfg.heads.draft_vocab_size, spec["ttt"], workdir,
                                  cfg.train.seed)  # fmt: skip
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.train.lr, betas=spec["betas"], eps=1e-8, weight_decay=0.0)
    sched = build_schedule(opt, spec["schedule"], warmup, steps, cfg.train.lr)
    model.train()
    model.target_model.eval()
    tokens, clipped, start, log = 0, 0, time.perf_counter(), []
    for step, batch in enumerate(training_batches(cfg, tokenizer, train_ds, steps)):
        model.zero_grad()
        plosses, _, acces = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                  loss_mask=batch["loss_mask"])  # fmt: skip
        loss = sum(0.8**i * plosses[i] for i in range(len(plosses)))  # main.py's weights
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, spec["clip"])
        clipped += int(float(norm) > spec["clip"])
        lr = opt.param_groups[0]["lr"]  # this step's
        opt.step()
        sched.step()
        tokens += int(batch["attention_mask"].sum())
        if step % 10 == 0 or step == steps - 1:
            line = {"step": step, "loss": float(loss.detach()), "acc0": acces[0], "grad_norm": float(norm),
                    "lr": lr}  # fmt: skip
            log.append(line)
            print(f"{arm} {json.dumps(line)}", flush=True)
    return {"arm": arm, "spec": {**spec, "betas": list(spec["betas"])}, "steps": steps, "lr": cfg.train.lr, "warmup": warmup,
            "train_tokens": tokens, "steps_clipped": clipped, "train_seconds": time.perf_counter() - start,
            "log": log, "model": model}  # fmt: skip


def save_reference_release(model, target, out: Path) -> None:
    """The reference's weights in its release layout (what SafeAILab publishes; config.json
    names the aux layers in SGLang's numbering, "output of layer j")."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {f"midlayer.{k}": v for k, v in model.midlayer.state_dict().items()}
    state.update({"fc.weight": model.fc.weight, "norm.weight": model.norm.weight, "lm_head.weight": model.lm_head.weight,
                  "d2t": model.d2t, "t2d": model.t2d})  # fmt: skip
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(out / "model.safetensors"))
    cfg = target.config
    layers = model.target_model.layers
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.hidden_size // cfg.num_attention_heads,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": 10000.0,  # the reference's rotary base (fixed in cnets)
        "vocab_size": cfg.vocab_size, "draft_vocab_size": int(model.lm_head.weight.shape[0]), "num_hidden_layers": 1,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]},
    }, indent=2))  # fmt: skip


@torch.no_grad()
def logits_agreement(model, heads_dir: Path, target, tokenizer, eval_ds, steps: int) -> list[float]:
    """Max |reference logits - imported heads' logits| per unrolled step, on 8 held-out windows:
    the reference model's own forward (its lm_head outputs, hooked) against draftheads'
    training graph unrolling the imported heads ``steps`` steps."""
    from draftheads import load_heads
    from draftheads.data import Collator
    from draftheads.train.model import TargetWithHeads

    batch = Collator.from_tokenizer(tokenizer)([eval_ds[i] for i in range(min(8, len(eval_ds)))])
    captured: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda m, a, out: captured.append(out.float()))
    model.eval()
    length, model.length = model.length, steps
    try:
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], loss_mask=batch["loss_mask"])
    finally:
        hook.remove()
        model.length = length
    heads = load_heads(heads_dir, target=target)
    heads.config.num_heads = steps
    ours: list[torch.Tensor] = []
    plain = heads.logits
    heads.logits = lambda state: (lambda out: (ours.append(out.float()), out)[1])(plain(state))
    TargetWithHeads(target, heads, labels="target", loss_chunk_size=10**9).eval()(**batch)
    # draftheads computes step k's logits for the rows whose predicted position t+2+k is a real
    # token, in (row, position) order: compare those rows.
    lm, am = batch["loss_mask"].bool(), batch["attention_mask"].bool()
    seq = lm.shape[1]
    diffs = []
    for k in range(steps):
        valid = torch.zeros(lm.shape[0], seq - 1, dtype=torch.bool)
        valid[:, : seq - 2 - k] = lm[:, 2 + k :] & am[:, 2 + k :]
        ref = captured[k][:, : seq - 1][valid]
        diffs.append(float((ref - ours[k]).abs().max()))
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eagle", required=True, help="SafeAILab/EAGLE checkout or bare git dir")
    ap.add_argument("--commit", default=None, help="commit to export from a git dir (default HEAD)")
    ap.add_argument("--config", default=str(CONFIG), help="the EAGLE-3 config both trainers follow")
    add_questions_argument(ap)
    ap.add_argument("--workdir", default="runs/reference-eagle3")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--arms", default="reference,draftheads",
                    help=f"comma-separated: {', '.join(REFERENCE_ARMS)}, draftheads (the config as it is), "
                         f"or draftheads:<arm> ({', '.join(measure.ARMS)})")  # fmt: skip
    ap.add_argument("--warmup", type=int, default=20, help="warmup steps, both trainers (the issue's: 20 for 200 steps)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--train-only", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    for arm in arms:
        name = arm.split(":", 1)[1] if arm.startswith("draftheads:") else None
        if arm not in REFERENCE_ARMS and arm != "draftheads" and name not in measure.ARMS:
            ap.error(f"unknown arm {arm!r}")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("DRAFTHEADS_NUM_THREADS", str(args.threads))
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)

    from draftheads.config import load_config
    from draftheads.data import build_datasets
    from draftheads.target import load_target

    cfg = load_config(args.config)
    target, tokenizer = load_target(cfg.target.name_or_path)
    train_ds, eval_ds, _ = build_datasets(cfg.data, tokenizer)
    src, sha = (None, None)
    infos: dict[str, dict] = {}
    for arm in arms:  # one training at a time
        heads_dir = workdir / "runs" / arm.replace(":", "-") / "heads"
        info_file = heads_dir.parent / "train-info.json"
        if (heads_dir / "config.json").is_file() and info_file.is_file():
            infos[arm] = json.loads(info_file.read_text())
            continue
        if arm in REFERENCE_ARMS:
            if src is None:
                src, sha = reference_source(Path(args.eagle), args.commit, workdir)
                cnets, configs = import_reference(src)
            info = train_reference(cnets, configs, target, tokenizer, cfg, train_ds, arm, args.steps, args.warmup,
                                   heads_dir.parent)
            model = info.pop("model")
            release = heads_dir.parent / "release"
            save_reference_release(model, target, release)
            from draftheads.export.importers import import_heads

            import_heads(release, heads_dir, target, overwrite=True)
            info["logits_max_abs_diff_per_step"] = logits_agreement(model, heads_dir, target, tokenizer, eval_ds, 7)
            info["reference_commit"] = sha
            print(f"{arm}: imported heads vs the reference's own logits, max |diff| per step "
                  f"{['%.1e' % d for d in info['logits_max_abs_diff_per_step']]}", flush=True)  # fmt: skip
        else:
            recipe = arm.split(":", 1)[1] if ":" in arm else None
            overrides = list(measure.ARMS[recipe]) if recipe else []
            info = draftheads_arm(args.config, heads_dir.parent, args.steps, [f"train.warmup_steps={args.warmup}", *overrides])
        info_file.write_text(json.dumps(info, indent=2))
        infos[arm] = info
    if args.train_only:
        return

    prompt_ids = load_prompts(tokenizer, args.questions, args.num_prompts)
    references = [target.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=args.new_tokens)
                  for p in prompt_ids]  # fmt: skip
    held = eval_ds.select(range(min(len(eval_ds), args.eval_batches * cfg.train.batch_size)))  # as heldout_windows
    results = {}
    for arm in arms:
        heads_dir = workdir / "runs" / arm.replace(":", "-") / "heads"
        results[arm] = {
            **measure.decode_stats(target, heads_dir, prompt_ids, references, args.new_tokens),
            "heldout": measure.heldout_top1(target, tokenizer, heads_dir, cfg, held),
            "train": {k: v for k, v in infos[arm].items() if k != "log"},
        }
        print(arm, json.dumps({k: results[arm][k] for k in ("chain", "tree", "heldout")}), flush=True)
    md = table(results, args.steps)
    print(md)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"steps": args.steps, "prompts": len(prompt_ids), "new_tokens": args.new_tokens,
                "chain": measure.CHAIN, "tree": measure.TREE, "command": " ".join(sys.argv)}  # fmt: skip
        (out / "results.json").write_text(json.dumps({**meta, "arms": results}, indent=2))
        (out / "results.md").write_text(f"`{meta['command']}`\n\n" + md)


def draftheads_arm(config: str, out: Path, steps: int, overrides: list[str]) -> dict:
    """The config (plus ``overrides``) trained by draftheads' own loop into OUT, mid-run
    evaluation, checkpoints and the export's tree timing off (this run decodes with fixed trees)."""
    from draftheads.config import load_config
    from draftheads.train import loop

    overrides = [f"train.output_dir={out}", f"train.max_steps={steps}", "train.eval_every=0", "train.save_every=0",
                 "train.choose_tree=false", *overrides]  # fmt: skip
    start = time.perf_counter()
    result = loop.run(load_config(config, overrides), overwrite=True)
    return {"config": str(config), "overrides": overrides, "train_seconds": time.perf_counter() - start,
            "final_eval": {k: v for k, v in result.metrics["final_eval"].items() if isinstance(v, (int, float))}}


def table(results: dict, steps: int) -> str:
    lines = [
        f"| EAGLE-3 heads, {steps} steps, trained by | 16-token tree: mean accepted | 5-token chain: mean accepted "
        "| chain reaches depth 1 / 2 / 3 / 4 / 5 | held-out top-1 at draft step 0 / 2 / 6 | held-out loss step 0 / 2 / 6 "
        "| decode steps (chain / tree) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, r in results.items():
        reach = " ".join(f"{x:.2f}" for x in r["chain"]["reach"])
        top1 = " / ".join(f"{r['heldout']['top1'][k]:.3f}" for k in (0, 2, 6))
        loss = " / ".join(f"{r['heldout']['loss'][k]:.2f}" for k in (0, 2, 6))
        lines.append(f"| {arm} | {r['tree']['mean_accepted']:.2f} | **{r['chain']['mean_accepted']:.2f}** | {reach} "
                     f"| {top1} | {loss} | {r['chain']['steps']} / {r['tree']['steps']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
