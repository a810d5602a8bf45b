"""The training loop: frozen target + draft heads through accelerate, top to bottom.

    run(cfg)
      1. Accelerator (launcher-aware), seed, tracker
      2. target + tokenizer (frozen), datasets
      3. heads (initialised as heads.init says), the wrapper module, AdamW on the heads only, the
         configured schedule with warmup (train/optim.py)
      4. accelerator.prepare(...); resume from a checkpoint if asked
      5. train, one optimizer step at a time: draw its micro-batches, count their loss tokens over
         every process (the loss is the step's token mean, however tokens fall), accumulate ->
         backward -> clip -> step (skipped, then stopped, on non-finite losses); log, evaluate,
         checkpoint every N steps; the heads of the evaluation with the best simulated
         acceptance are exported to best/
      6. final evaluation, export the heads, metrics.json, tear down

DDP / DeepSpeed ZeRO / mixed precision come from the ``accelerate launch`` config, not from here.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Sampler

from ..atomic import write_json_atomically
from ..config import ExperimentConfig, HeadsSpec, TargetConfig
from ..export.card import write_run_cards
from ..device import (
    accelerator_kwargs,
    cpu_threads_for_single_process,
    launch_env,
    resolve_mixed_precision,
)
from .checkpoint import (
    CheckpointError,
    export_heads,
    heads_from_state,
    heads_state,
    load_checkpoint,
    read_state,
    register_heads_only,
    resume_candidates,
    save_checkpoint,
)
from ..tune.training import SAMPLE_ROWS, write_export_tree
from .metrics import HeadStats, format_heads, ranks_for, static_tree
from .model import TargetWithHeads
from .optim import build_optimizer, build_scheduler
from .stability import MAX_NONFINITE_STEPS, NonFiniteGuard
from .run_dir import RunFolderError, check_context, check_resume_config, check_writable, clear_run, guard_fresh_run
from .run_lock import RunLock
from .tracking import init_trackers, prepare_tracker


@dataclass
class TrainResult:
    output_dir: Path
    heads_dir: Path
    step: int
    metrics: dict[str, Any]
    heads: torch.nn.Module = field(repr=False)  # the trained heads (unwrapped), on every process


def run(cfg: ExperimentConfig, overwrite: bool = False) -> TrainResult:
    """Train heads as configured; return where they were exported and the final metrics.

    ``overwrite``: replace a previous run's files in ``train.output_dir`` (otherwise a fresh run
    into a folder that holds a run is refused; see run_dir.py). While it runs, the run holds the
    folder's lock (``RunLock``): a second run into it is refused at once."""
    with contextlib.ExitStack() as held:  # the run lock, released however the run ends
        return _run(cfg, overwrite, held)


def _run(cfg: ExperimentConfig, overwrite: bool, held: contextlib.ExitStack) -> TrainResult:
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, GradientAccumulationPlugin, set_seed

    t = cfg.train
    output_dir = Path(t.output_dir)
    timer = StageTimer()
    # fail fast, before loading anything: a bad output folder, another run's files, a bad resume
    check_writable(output_dir)
    from ..data.load import check_eval_source

    check_eval_source(cfg.data)  # never evaluate (and pick best/) on the training rows
    if overwrite and t.resume is not None:
        raise RunFolderError("--overwrite and --resume (train.resume) contradict each other: choose one")
    if int(os.environ.get("RANK", "0")) == 0:  # one lock per run: the main process holds it for all
        lock = held.enter_context(RunLock(output_dir))
        if lock.took_over:
            _main_print(f"took over the lock of an earlier run that no longer runs (pid {lock.took_over.get('pid')})")
    candidates = resume_candidates(t.resume, output_dir)
    check_config = lambda path, state: check_resume_config(path, state.get("config"), cfg.to_dict())  # noqa: E731
    if candidates:
        with contextlib.suppress(CheckpointError):  # unreadable: load_checkpoint reports it and falls back
            check_config(candidates[0], read_state(candidates[0]))
    elif not overwrite:
        guard_fresh_run(output_dir, False, t.resume, cfg.to_dict())

    # -- 1. accelerator, seed, tracker --------------------------------------------------------
    log_with = prepare_tracker(cfg.tracking, announce=_main_print)
    accelerator = Accelerator(
        # The loop groups micro-batches into steps itself (see step_denominators): accumulate()
        # must not also end a step where the dataloader ends.
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=t.grad_accum, sync_with_dataloader=False),
        mixed_precision=resolve_mixed_precision(t.mixed_precision),
        log_with=log_with,
        project_dir=str(output_dir),
        # We step the scheduler once per optimizer step ourselves. accelerate's default steps it
        # num_processes times per step (except under DeepSpeed), which would change the schedule
        # with the number of GPUs.
        step_scheduler_with_optimizer=False,
        **accelerator_kwargs(launch_env()),
    )
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    zero3 = deepspeed and accelerator.state.deepspeed_plugin.zero_stage == 3
    say = accelerator.print
    set_seed(t.seed)
    accelerator.wait_for_everyone()  # every process has checked the folder before it changes
    if accelerator.is_main_process:
        output_dir.mkdir(parents=True, exist_ok=True)
        if overwrite:
            removed = clear_run(output_dir)
            if removed:
                say(f"--overwrite: removed the previous run's {', '.join(removed)} from {output_dir}")
        write_json_atomically(output_dir / "config.json", cfg.to_dict())
    threads = cpu_threads_for_single_process()
    if threads is not None:
        torch.set_num_threads(threads)
    say(
        f"draftheads: {accelerator.num_processes} process(es), {accelerator.distributed_type.value}, "
        f"device {accelerator.device}, mixed precision {accelerator.mixed_precision}"
        + (f", {threads} CPU threads" if threads is not None else "")
    )

    # -- 2. target, tokenizer, data ------------------------------------------------------------
    with timer("load_target"):
        # Straight onto the GPU (not through host RAM once per process), unless ZeRO-3 shards it.
        device = accelerator.device if accelerator.device.type == "cuda" and not zero3 else None
        target, tokenizer = load_target(cfg.target, accelerator, device=device)
    check_context(cfg.data.max_length, target.config, say)
    with timer("build_data"):
        from ..data import Collator, build_datasets

        with accelerator.main_process_first():
            train_ds, eval_ds, data_stats = build_datasets(cfg.data, tokenizer)
    say(data_stats.summary())

    # -- 3. heads, wrapper, optimizer, schedule --------------------------------------------------
    set_seed(t.seed)  # heads' init does not depend on what loading consumed from the RNG
    heads = build_heads(cfg.heads, target, zero3=zero3, tokenizer=tokenizer)
    if cfg.heads.init_from:  # continue from saved or imported heads (their draft vocabulary included)
        heads = init_heads_from(heads, cfg.heads.init_from, target)
        say(f"heads initialised from {cfg.heads.init_from}")
    elif hasattr(heads, "set_draft_vocab"):  # EAGLE-3: its own LM head covers the most frequent training tokens
        heads.set_draft_vocab(training_token_counts(train_ds, heads.config.vocab_size))
        say(f"draft vocabulary: the {heads.draft_to_target.numel()} most frequent training tokens")
    if hasattr(heads, "choose_mask_token"):  # DFlash: its mask token, checked against the tokenizer
        say(f"mask token: id {heads.choose_mask_token(tokenizer)}")
    model = TargetWithHeads(
        target, heads, loss_decay=t.loss_decay, loss_chunk_size=t.loss_chunk_size, topk=t.topk, labels=t.labels
    )
    params = model.trainable_parameters()
    say(
        f"heads: {cfg.heads.head_type} x{heads.config.num_heads}, {heads.config.num_layers} layer(s), "
        f"lm_head {heads.config.lm_head}; {sum(p.numel() for p in params) / 1e6:.2f} M trainable parameters "
        f"(target {sum(_numel(p) for p in target.parameters()) / 1e6:.1f} M, frozen)"
    )
    optimizer = build_optimizer(params, t)

    collator = Collator.from_tokenizer(tokenizer)
    if cfg.data.features:  # the target's features come from an offline cache (draftheads cache-features)
        from .features import open_cache

        train_ds, eval_ds, collator = open_cache(cfg, target, tokenizer, heads, train_ds, eval_ds, collator)
        say(f"target features: read from the cache {cfg.data.features} (the target is not run)")
    train_collator = collator  # [packing] evaluation keeps the row collator
    if cfg.data.packing:  # [packing] rows laid end to end in windows, documents kept apart (train/packing.py)
        from .packing import pack_for_training

        train_ds, train_collator = pack_for_training(cfg, target, train_ds, collator, say, check_target=not zero3)
    sampler = EpochShuffleSampler(len(train_ds), seed=t.seed)
    if t.group_by_length:  # batches of similar lengths: less padding (draftheads/data/sampling.py)
        from ..data.sampling import LengthGroupedSampler, example_lengths

        sampler = LengthGroupedSampler(example_lengths(train_ds), t.batch_size, seed=t.seed)
    train_dl = DataLoader(train_ds, batch_size=t.batch_size, sampler=sampler, collate_fn=train_collator)  # [packing]
    eval_dl = None
    if eval_ds is not None and len(eval_ds) > 0:
        if t.eval_batches:  # a fixed subset, always iterated to the end (no early break)
            eval_ds = eval_ds.select(range(min(len(eval_ds), t.eval_batches * t.batch_size * accelerator.num_processes)))
        eval_dl = DataLoader(
            EvalShard(eval_ds, accelerator.process_index, accelerator.num_processes),
            batch_size=t.batch_size, shuffle=False, collate_fn=collator,
        )  # fmt: skip

    batches_per_epoch = math.ceil(math.ceil(len(train_ds) / t.batch_size) / accelerator.num_processes)
    steps_per_epoch = math.ceil(batches_per_epoch / t.grad_accum)
    max_steps = t.max_steps or steps_per_epoch * t.num_epochs
    scheduler = build_scheduler(optimizer, t, max_steps)

    # -- 4. prepare, resume --------------------------------------------------------------------
    if deepspeed:
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        if ds_config.get("gradient_clipping", "auto") == "auto":
            ds_config["gradient_clipping"] = float(t.max_grad_norm or 0.0)
    else:
        register_heads_only(accelerator)
    model, optimizer, train_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, scheduler)
    assert len(train_dl) == batches_per_epoch, (len(train_dl), batches_per_epoch)

    step, epoch, skip = 0, 0, 0
    best = BestHeads(output_dir / "best")
    checkpoint = None
    if candidates:
        with timer("resume"):
            checkpoint, state = load_checkpoint(accelerator, candidates, model, check=check_config, say=say)
        step, epoch, skip = state["step"], state["epoch"], state["batches_in_epoch"]
        best.restore(state.get("best"))
        if state.get("num_processes", accelerator.num_processes) != accelerator.num_processes:
            say(f"warning: {checkpoint} was written by {state['num_processes']} processes; the data order will differ")
        say(f"resumed from {checkpoint}: step {step}, epoch {epoch}, {skip} batches into the epoch")
    elif t.resume == "auto":
        say(f"resume=auto: no checkpoint in {output_dir / 'checkpoints'} yet, starting fresh")

    init_trackers(accelerator, cfg.tracking, cfg.to_dict(), output_dir)
    say(
        f"training {max_steps} steps ({steps_per_epoch} per epoch): batch {t.batch_size} x accum {t.grad_accum} "
        f"x {accelerator.num_processes} process(es), lr {t.lr}, warmup {t.warmup_steps}, {t.lr_schedule} schedule, "
        f"AdamW betas {tuple(t.adam_betas)}, clip {t.max_grad_norm or 'off'}"
    )

    # -- 5. train ------------------------------------------------------------------------------
    num_heads = heads.config.num_heads
    window = TrainWindow(num_heads, accelerator.device)  # statistics since the last log line
    progress = _progress(max_steps, step, accelerator)
    last_saved, batch_in_epoch, evals = (step if checkpoint is not None else -1), skip, []
    if checkpoint is not None:  # metrics.json covers the whole run, not only the part after the resume
        evals = list(state.get("evals") or [])
        window.total_tokens, window.total_seconds = int(state.get("train_tokens", 0)), float(state.get("train_seconds", 0.0))
    label_counts = torch.zeros_like(heads.token_counts)  # this process's, since the last merge
    core = accelerator.unwrap_model(model)  # TargetWithHeads, under any wrapper
    guard = NonFiniteGuard(1 if deepspeed else MAX_NONFINITE_STEPS)
    model.train()
    train_start = time.perf_counter()

    while step < max_steps:
        train_dl.set_epoch(epoch)  # seeds this epoch's shuffle (also inside skip_first_batches)
        batches = iter(accelerator.skip_first_batches(train_dl, skip) if skip else train_dl)
        batch_in_epoch, skip = skip, 0
        epoch_done = False
        while step < max_steps:
            # One optimizer step: grad_accum micro-batches (fewer at the end of an epoch), drawn
            # first so the loss can be normalised by the step's token count on every process.
            group = list(itertools.islice(batches, t.grad_accum))
            if not group:
                epoch_done = True
                break
            denominators = step_denominators(accelerator, core, group, t.grad_accum)
            accelerator.step = t.grad_accum - len(group)  # accumulate() syncs at the group's last batch
            for batch in group:
                core.reseed_noise(_noise_seed(t.seed, accelerator.process_index, epoch, batch_in_epoch), accelerator.device)
                with accelerator.accumulate(model):
                    out = model(**batch, loss_denominators=denominators)
                    accelerator.backward(out["loss"])
                    guard.add(out["loss"])
                    if accelerator.sync_gradients and guard.step_is_bad(accelerator, step + 1, scheduler.get_last_lr()[0]):
                        pass  # a non-finite loss somewhere: no update (stability.py)
                    else:
                        if accelerator.sync_gradients and t.max_grad_norm:
                            accelerator.clip_grad_norm_(params, t.max_grad_norm)
                        optimizer.step()  # no-op between accumulation boundaries
                    optimizer.zero_grad(set_to_none=True)
                batch_in_epoch += 1
                window.add(out, scale=t.grad_accum * accelerator.num_processes)
                label_counts += out["label_counts"]
            assert accelerator.sync_gradients, "the last micro-batch of a step must sync"
            scheduler.step()
            step += 1
            window.steps += 1
            progress.update(1)

            if step % t.log_every == 0 or step == max_steps:
                logs = window.flush(accelerator, t.topk)
                logs["train/lr"] = scheduler.get_last_lr()[0]
                logs["train/epoch"] = epoch + batch_in_epoch / batches_per_epoch
                accelerator.log(logs, step=step)
                progress.set_postfix(loss=f"{logs['train/loss']:.3f}", tok_s=f"{logs['train/tokens_per_second']:.0f}")
                _write(progress, _train_line(step, max_steps, logs))

            if eval_dl is not None and t.eval_every and step % t.eval_every == 0 and step < max_steps:
                evals.append(_eval_and_log(accelerator, model, eval_dl, t, num_heads, step, progress))
                best.offer(accelerator, model, heads, label_counts, evals[-1])
                window.restart_clock()  # evaluation time is not training throughput

            if t.save_every and step % t.save_every == 0:
                merge_label_counts(accelerator, heads, label_counts)
                position = _position(epoch, batch_in_epoch, batches_per_epoch)
                history = _run_history(accelerator, evals, window)  # a collective
                save_checkpoint(accelerator, output_dir, step, _trainer_state(step, position, max_steps, accelerator, best, cfg, history))
                last_saved = step
                window.restart_clock()
        if not epoch_done:
            break
        epoch += 1  # the epoch ran out before max_steps
    timer.add("train", time.perf_counter() - train_start)
    progress.close()

    merge_label_counts(accelerator, heads, label_counts)
    if t.save_every and last_saved != step:
        position = _position(epoch, batch_in_epoch, batches_per_epoch)
        history = _run_history(accelerator, evals, window)  # a collective
        save_checkpoint(accelerator, output_dir, step, _trainer_state(step, position, max_steps, accelerator, best, cfg, history))

    # -- 6. final evaluation, export, metrics --------------------------------------------------
    final_eval: dict[str, float] = {}
    if eval_dl is not None:
        with timer("eval"):
            final_eval = _eval_and_log(accelerator, model, eval_dl, t, num_heads, step, None)
        with timer("export"):
            best.offer(accelerator, model, heads, label_counts, final_eval)
    heads_dir = output_dir / "heads"
    with timer("export"):
        export_heads(accelerator, model, heads_dir)
    with timer("choose_tree"):  # heads leave training ready to decode fast: tree + draft vocabulary
        sample_ds = eval_ds if eval_ds is not None and len(eval_ds) else train_ds
        rows = [torch.as_tensor(sample_ds[i]["input_ids"]) for i in range(min(SAMPLE_ROWS, len(sample_ds)))]
        chosen_tree = write_export_tree(
            accelerator, model, heads_dir, rows, final_eval.get("eval/rank_accuracy"),
            skip_reason="ZeRO-3 shards the target across processes" if zero3 else None,
        )
    metrics = {
        "step": step,
        "max_steps": max_steps,
        "num_processes": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,
        "final_eval": final_eval,
        "evals": evals,
        # the evaluation whose heads are in best/ (highest eval/simulated_acceptance); None without eval
        "best": best.as_dict(),
        "train_tokens": window.total_tokens,
        # tokens over time spent in training steps (evaluation and checkpoint time excluded)
        "train_tokens_per_second": window.total_tokens / window.total_seconds if window.total_seconds else 0.0,
        "stage_seconds": timer.seconds,
        "data": data_stats.as_dict(),
        "tree": chosen_tree,  # what write_export_tree put in heads/tree.json (None: device default)
    }
    if accelerator.is_main_process:
        write_json_atomically(output_dir / "metrics.json", metrics, default=float)
        write_run_cards(output_dir, cfg.to_dict(), metrics)  # README.md: what the heads are, how to serve them
        say(f"heads exported to {heads_dir}")
    trained_heads = accelerator.unwrap_model(model).heads
    if zero3:  # each process holds shards: return whole heads, like every other setup
        trained_heads = heads_from_state(trained_heads, heads_state(accelerator, model, everywhere=True))
    _teardown(accelerator)
    return TrainResult(output_dir=output_dir, heads_dir=heads_dir, step=step, metrics=metrics, heads=trained_heads)


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def load_target(cfg: TargetConfig, accelerator=None, device: torch.device | None = None):
    """The frozen target and its tokenizer as ``cfg`` says (see draftheads/target.py)."""
    from ..target import load_target as load

    return load(
        cfg.name_or_path,
        device=device,
        dtype=cfg.dtype,
        runs_on=accelerator.device if accelerator is not None else None,
        trust_remote_code=cfg.trust_remote_code,
        revision=cfg.revision,
        attn_implementation=cfg.attn_implementation,
        resolving=accelerator.main_process_first() if accelerator is not None else None,  # built once
    )


def build_heads(spec: HeadsSpec, target: torch.nn.Module, zero3: bool = False, tokenizer=None) -> torch.nn.Module:
    """Fresh heads of ``spec``'s type for ``target``; ``tokenizer`` settles options chosen from it
    (P-EAGLE's mask token)."""
    from ..heads import head_types
    from ..heads.init import apply_init

    cls = head_types()[spec.head_type]
    ctx = contextlib.nullcontext()
    if zero3:  # the target was loaded sharded: gather its LM head to size and initialise the heads
        import deepspeed

        ctx = deepspeed.zero.GatheredParameters([target.get_output_embeddings().weight], modifier_rank=None)
    options = {name: getattr(spec, name) for name in cls.spec_options}  # what this head type takes
    resolve = getattr(cls, "resolve_options", None)
    if resolve is not None:
        options = resolve(options, target, tokenizer)
    with ctx:
        heads = cls.for_target(target, num_heads=spec.num_heads, num_layers=spec.num_layers, **options)
        return apply_init(heads, spec.init, target)  # heads.init (draftheads/heads/init.py)


def init_heads_from(heads: torch.nn.Module, path: str, target: torch.nn.Module) -> torch.nn.Module:
    """The heads folder ``path`` (saved or imported) to continue training, loaded strictly and
    checked against ``target``. What the config sets (type, sizes, feature layers, draft vocabulary,
    fc bias) must equal what ``path`` holds: an error names every difference. The draft layer's
    geometry comes from ``path`` (an imported EAGLE layer may differ from the target's); the training
    settings (EAGLE's unrolled steps, feature noise) from the config."""
    from ..heads import load_heads

    saved = load_heads(path, target=target)
    mine, theirs = heads.config, saved.config
    problems = [
        f"{name}: config has {getattr(mine, name)!r}, {path} has {getattr(theirs, name)!r}"
        for name in ("head_type", "num_layers", "hidden_size", "vocab_size", "lm_head")
        if getattr(mine, name) != getattr(theirs, name)
    ]
    if mine.head_type in ("medusa", "hydra") and mine.num_heads != theirs.num_heads:
        problems.append(f"num_heads: config has {mine.num_heads}, {path} has {theirs.num_heads}")
    for key in ("feature_layers", "draft_vocab_size", "fc_bias", "block_size", "mask_token_id"):
        default = True if key == "fc_bias" else None  # EAGLE heads saved before the option had an fc bias
        # (an unset dflash mask token takes the folder's)
        if key in mine.extra and mine.extra[key] is not None and mine.extra[key] != theirs.extra.get(key, default):
            problems.append(f"heads.{key}: config has {mine.extra[key]!r}, {path} has {theirs.extra.get(key)!r}")
    if problems:
        raise ValueError(f"heads.init_from: {path} does not match the configured heads:\n  - " + "\n  - ".join(problems))
    theirs.num_heads = mine.num_heads  # EAGLE: draft steps unrolled in training (no tensors depend on it)
    for key in ("noise", "loss_gamma", "block_loss", "num_anchors", "greedy_path"):  # training settings come from the config
        if key in mine.extra:
            theirs.extra[key] = mine.extra[key]
    return saved


def training_token_counts(dataset, vocab_size: int) -> torch.Tensor:
    """How often each token id is a trained (loss-masked) token in ``dataset``; the same on every
    process (a full pass over the tokenized split, no randomness)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for row in dataset.with_format("torch").iter(batch_size=1024):
        for ids, mask in zip(row["input_ids"], row["loss_mask"]):
            counts += torch.bincount(ids[mask.bool()].long(), minlength=vocab_size)[:vocab_size]
    return counts


class EpochShuffleSampler(Sampler[int]):
    """A fresh permutation per epoch from ``seed + epoch``: the same on every process and on resume,
    so ``skip_first_batches`` lands on exactly the batches a straight run would have seen next."""

    def __init__(self, size: int, seed: int = 0) -> None:
        self.size, self.seed, self.epoch = size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.size, generator=g).tolist())

    def __len__(self) -> int:
        return self.size


@torch.no_grad()
def evaluate(accelerator, model, eval_dl, num_heads: int, topk: int, decay: float) -> dict[str, Any]:
    """Per-head loss / top-1 / top-k, simulated chain acceptance and the simulated acceptance of
    the tree decoding will use (Medusa/Hydra: from per-rank accuracies, kept under
    ``eval/rank_accuracy`` as a [heads, ranks] list) over the (fixed) eval set."""
    tree = static_tree(accelerator.unwrap_model(model).heads)
    ranks = ranks_for(tree)
    stats = HeadStats(num_heads, accelerator.device, ranks=ranks)
    was_training = model.training
    model.eval()
    for batch in eval_dl:
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        stats.add(model(**batch, rank_stats=ranks)["stats"])
    model.train(was_training)
    reduced = stats.reduced(accelerator)
    summary: dict[str, Any] = reduced.summary(topk, prefix="eval/", tree=tree)
    losses = [summary[f"eval/loss_head{k}"] for k in range(num_heads)]
    # NaN when a head's loss is NaN (diverged, or no eval position reaches that far): never a
    # partial sum that looks like a loss
    summary["eval/loss"] = sum(decay**k * v for k, v in enumerate(losses))
    if ranks:
        summary["eval/rank_accuracy"] = reduced.rank_accuracy().tolist()
    return summary


class EvalShard(torch.utils.data.Dataset):
    """This process's share of the eval rows (rows ``rank``, ``rank + world``, ...), padded to
    the same length on every process with rows that carry no loss-masked token. Every process
    runs the same number of forward passes (ZeRO-3 and DDP need that), and each eval row is
    counted exactly once: ``accelerate.prepare`` would pad uneven shards with repeated rows,
    which the summed metrics would count twice."""

    def __init__(self, dataset, rank: int, world: int) -> None:
        self.dataset = dataset
        self.rows = list(range(rank, len(dataset), world))
        self.length = math.ceil(len(dataset) / world)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        if i < len(self.rows):
            return self.dataset[self.rows[i]]
        ids = list(self.dataset[0]["input_ids"])[:2]
        return {"input_ids": ids, "loss_mask": [0] * len(ids)}  # padding: nothing to count


class BestHeads:
    """The heads of the evaluation with the highest ``eval/simulated_acceptance`` so far, exported
    to ``path`` (atomically, by the heads' own writer) whenever an evaluation beats the previous
    best. The loss is not what decoding pays for; the simulated acceptance of the tree is. Every
    process calls ``offer`` with the same (reduced) summary, so all take the same decision and
    meet in the export's collectives."""

    KEY = "eval/simulated_acceptance"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step: int | None = None
        self.value = -math.inf

    def offer(self, accelerator, model, heads, label_counts: torch.Tensor, summary: dict[str, Any]) -> bool:
        value = summary.get(self.KEY, math.nan)
        if math.isnan(value) or value <= self.value:
            return False
        if not math.isfinite(summary.get("eval/loss", math.nan)):
            accelerator.print(f"warning: eval @ {summary['step']}: the loss is not finite; best/ keeps its heads")
            return False
        merge_label_counts(accelerator, heads, label_counts)  # the export carries the counts so far
        export_heads(accelerator, model, self.path)
        self.step, self.value = int(summary["step"]), float(value)
        return True

    def restore(self, state: dict[str, Any] | None) -> None:
        """Continue from a checkpoint's record, so a resumed run only replaces best/ with better heads."""
        if state:
            self.step, self.value = int(state["step"]), float(state["simulated_acceptance"])

    def as_dict(self) -> dict[str, Any] | None:
        if self.step is None:
            return None
        return {"step": self.step, "simulated_acceptance": self.value, "path": str(self.path)}


class TrainWindow:
    """Training statistics since the last log line, reduced over processes when flushed."""

    def __init__(self, num_heads: int, device: torch.device) -> None:
        self.stats = HeadStats(num_heads, device)
        self.device = device
        self.total_tokens, self.total_seconds = 0, 0.0
        self._reset()

    def _reset(self) -> None:
        self.stats.reset()
        self.loss_sum, self.steps, self.tokens = 0.0, 0, 0
        self.restart_clock()

    def restart_clock(self) -> None:
        self.start = time.perf_counter()

    def add(self, out: dict[str, torch.Tensor], scale: int = 1) -> None:
        """One micro-batch; ``scale``: grad_accum x processes, what its loss was multiplied by
        (see ``step_denominators``), so the sum over a step's micro-batches and processes is the
        step's loss. The loop counts ``steps``."""
        self.stats.add(out["stats"])
        self.loss_sum += out["loss"].item() / scale
        self.tokens += int(out["tokens"])

    def flush(self, accelerator, topk: int) -> dict[str, float]:
        """Loss, per-head loss and top-1, tokens/s over all processes (a collective: call on all)."""
        elapsed = time.perf_counter() - self.start
        tokens = accelerator.reduce(torch.tensor(self.tokens, device=self.device), "sum").item()
        loss = accelerator.reduce(torch.tensor(self.loss_sum, device=self.device), "sum").item() / max(self.steps, 1)
        summary = self.stats.reduced(accelerator).summary(topk, prefix="train/")
        self.total_tokens += tokens
        self.total_seconds += elapsed
        self._reset()
        return {
            "train/loss": loss,
            "train/tokens_per_second": tokens / max(elapsed, 1e-9),
            **{k: v for k, v in summary.items() if "loss_head" in k or "top1_head" in k},
        }


def _train_line(step: int, max_steps: int, logs: dict[str, float]) -> str:
    return (
        f"step {step}/{max_steps} | loss {logs['train/loss']:.4f} "
        f"| heads {format_heads(logs, 'loss', 'train/', '{:.3f}')} | top1 {format_heads(logs, 'top1', 'train/')} "
        f"| lr {logs['train/lr']:.2e} | {logs['train/tokens_per_second']:.0f} tok/s"
    )


def step_denominators(accelerator, core: TargetWithHeads, group: list[dict], grad_accum: int) -> torch.Tensor:
    """The loss denominators of one optimizer step (a collective: call on every process).

    Each head's loss is its summed cross-entropy over the step's tokens divided by their count
    over every micro-batch and process (the step's token-level mean), not a mean per micro-batch
    and process, which would weight a token by how full its micro-batch happened to be. The count
    is divided by ``grad_accum x processes`` because ``backward`` divides the loss by
    ``grad_accum`` and DDP/ZeRO average gradients over processes: the summed gradient is then
    exactly the gradient of the step's mean."""
    local = sum(core.loss_counts(b["input_ids"], b.get("attention_mask"), b.get("loss_mask"), b.get("position_ids")) for b in group)  # [packing]
    total = accelerator.reduce(local.to(accelerator.device, torch.float64), reduction="sum")
    return (total / (grad_accum * accelerator.num_processes)).float()


def merge_label_counts(accelerator, heads: torch.nn.Module, label_counts: torch.Tensor) -> None:
    """Add every process's label counts to ``heads.token_counts`` (identical on all ranks after),
    then restart the local tally. Called before each checkpoint and before the export."""
    heads.token_counts += accelerator.reduce(label_counts, reduction="sum").to(heads.token_counts.device)
    label_counts.zero_()


def _eval_and_log(accelerator, model, eval_dl, t, num_heads: int, step: int, progress) -> dict[str, Any]:
    summary = evaluate(accelerator, model, eval_dl, num_heads, t.topk, t.loss_decay)
    accelerator.log({k: v for k, v in summary.items() if isinstance(v, (int, float))}, step=step)  # scalars only
    _write(
        progress,
        f"eval @ {step} | loss {summary['eval/loss']:.4f} | top1 {format_heads(summary, 'top1', 'eval/')} "
        f"| top{t.topk} {format_heads(summary, f'top{t.topk}', 'eval/')} "
        f"| chain acceptance {summary['eval/acceptance_length']:.3f} "
        f"| simulated acceptance {summary['eval/simulated_acceptance']:.3f} tokens/step",
    )
    return {"step": step, **summary}


def _position(epoch: int, batch_in_epoch: int, batches_per_epoch: int) -> tuple[int, int]:
    """Where the data stands after ``batch_in_epoch`` batches: the next epoch if this one is done."""
    return (epoch + 1, 0) if batch_in_epoch >= batches_per_epoch else (epoch, batch_in_epoch)


def _run_history(accelerator, evals: list[dict[str, Any]], window: "TrainWindow") -> dict[str, Any]:
    """What metrics.json reports about the steps so far, for a checkpoint to carry across a resume:
    the evaluations and the trained tokens (those of the window not yet logged included; a
    collective: call on every process)."""
    pending = accelerator.reduce(torch.tensor(window.tokens, device=window.device), "sum").item()
    return {"evals": evals, "train_tokens": int(window.total_tokens + pending), "train_seconds": window.total_seconds}


def _trainer_state(step, position, max_steps, accelerator, best: "BestHeads | None" = None, cfg=None,
                   history: dict[str, Any] | None = None) -> dict[str, Any]:
    epoch, batches = position
    return {
        **(history or {}),
        "step": step,
        "epoch": epoch,
        "batches_in_epoch": batches,
        "max_steps": max_steps,
        "num_processes": accelerator.num_processes,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "best": best.as_dict() if best is not None else None,
        # what a resume compares against (run_dir.check_resume_config)
        "config": cfg.to_dict() if cfg is not None else None,
    }


def _noise_seed(seed: int, process: int, epoch: int, batch_in_epoch: int) -> int:
    """A seed for the training noise of one micro-batch: a function of where the batch is in the
    run (not of what consumed the global RNG before), different on every process."""
    return (((seed * 1_000_003 + process) * 1_000_003 + epoch) * 1_000_003 + batch_in_epoch) % (2**63 - 1)


def _numel(p: torch.Tensor) -> int:
    return getattr(p, "ds_numel", None) or p.numel()  # ZeRO-3 shards leave p.numel() == 0


class StageTimer:
    """Wall seconds per named stage, for metrics.json."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)


def _progress(total: int, initial: int, accelerator):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="train", disable=not accelerator.is_local_main_process, dynamic_ncols=True)


def _write(progress, line: str) -> None:
    """Print on the main process without breaking the progress bar."""
    from accelerate import PartialState
    from tqdm.auto import tqdm

    if PartialState().is_main_process:
        tqdm.write(line) if progress is not None and not progress.disable else print(line, flush=True)


def _main_print(line: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(line, flush=True)


def _teardown(accelerator) -> None:
    """Wait for every process, end the trackers and leave the process group cleanly (without
    this, about one multi-process CPU run in three aborts at exit), then reset accelerate's
    singletons so ``run`` can be called again in the same process."""
    from accelerate.state import AcceleratorState, GradientState

    accelerator.wait_for_everyone()
    accelerator.end_training()  # also destroys the process group in accelerate >= 1.x
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
