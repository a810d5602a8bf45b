"""The training recipe: a frozen target, trainable draft heads, accelerate around both.

Read it top to bottom; each method is one stage and keeps what it builds on the object::

    Trainer(cfg).run()
      check_run_folder  before loading anything: the output folder, its lock, what a resume finds
      setup             accelerator + seed + tracker, target + data, heads + wrapper + optimizer +
                        schedule, data loaders; then (every check passed) the folder's config.json;
                        accelerator.prepare, resume from a checkpoint. A run that fails before it
                        saved anything removes the config.json it wrote (``release_folder``)
      train             one optimizer step at a time (``train_step``): draw the step's micro-batches,
                        count their loss tokens over every process (the loss is the step's token
                        mean, however tokens fall), accumulate -> backward -> clip -> step (skipped,
                        then stopped, on non-finite losses); log, evaluate, checkpoint every N steps
      evaluate          the eval set's figures; the heads of the evaluation with the best simulated
                        acceptance are exported to best/
      save              a resumable checkpoint (heads, optimizer, schedule, RNG, where the data is)
      finish            final evaluation (kept in the last checkpoint: a run extended with a
                        larger max_steps keeps it in its history), export the heads, choose
                        their tree, metrics.json, tear down

DDP / DeepSpeed ZeRO / FSDP / mixed precision come from the ``accelerate launch`` config, not
from here; ``distributed.py`` says what each of them needs from the recipe.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import GradientAccumulationPlugin, set_seed
from torch.utils.data import DataLoader

from ..atomic import exclusive_lock, write_json_atomically
from ..config import ExperimentConfig
from ..data import Collator, build_datasets
from ..data.load import check_eval_source
from ..data.sampling import LengthGroupedSampler, example_lengths
from ..device import accelerator_kwargs, cpu_threads_for_single_process, launch_env, resolve_mixed_precision
from ..export.card import write_run_cards
from .checkpoint import (
    CheckpointError,
    export_heads,
    load_checkpoint,
    read_state,
    record_state,
    resume_candidates,
    save_checkpoint,
)
from .components import (
    build_heads,
    check_mask_token_absent,
    check_something_to_learn,
    init_heads_from,
    load_target,
    start_lm_head_from_target,
    training_token_counts,
)
from .distributed import Parallelism
from .evaluation import BestHeads, EvalShard, evaluate_and_log
from ..data.plan_prompts import AUTO as AUTO_PROMPTS, default_set as default_plan_set, encode_prompts, read_prompt_texts
from ..tune.training import PLAN_PROMPT_TOKENS, SAMPLE_ROWS, write_export_tree
from .features import AUTO, auto_cache_dir, build_cache, fingerprint, open_cache
from .packing import check_packable, pack_for_training
from .model import TargetWithHeads
from .optim import build_optimizer, build_scheduler
from .progress import StageTimer, TrainWindow, main_print, progress_bar, train_line, write_line
from .run_dir import (
    RunFolderError,
    check_context,
    check_is_run_folder,
    check_resume_config,
    check_writable,
    clear_run,
    existing_run,
    guard_fresh_run,
)
from .run_lock import RunLock
from .stability import MAX_NONFINITE_STEPS, NonFiniteGuard
from .step import EpochShuffleSampler, data_position, merge_label_counts, noise_seed, step_denominators
from .tracking import init_trackers, prepare_tracker, tracker_run_id


@dataclass
class TrainResult:
    output_dir: Path
    heads_dir: Path
    step: int
    metrics: dict[str, Any]
    heads: torch.nn.Module = field(repr=False)  # the trained heads (unwrapped), on every process


class Trainer:
    """One training run of ``cfg``. ``overwrite``: replace a previous run's files in
    ``train.output_dir`` (otherwise a fresh run into a folder that holds a run is refused; see
    run_dir.py). While it runs, the run holds the folder's lock (``RunLock``): a second run into it
    is refused at once. A Trainer runs once."""

    def __init__(self, cfg: ExperimentConfig, overwrite: bool = False) -> None:
        self.cfg, self.t, self.overwrite = cfg, cfg.train, overwrite
        self.output_dir = Path(cfg.train.output_dir)
        self.timer = StageTimer()
        # where training stands: advanced by train(), restored by a resume, saved in checkpoints
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.evals: list[dict[str, Any]] = []
        self.last_saved = -1
        self.tracker_run: str | None = None  # the W&B run's id: a resumed run continues that W&B run
        self.took_over_folder = False  # a folder whose earlier run never saved a step (check_run_folder)
        self.plan_prompts: list[torch.Tensor] | None = None  # what the plan is timed on (train.plan_prompts)

    def run(self) -> TrainResult:
        """Check, set up, train, finish; the run lock is released however the run ends, and a run
        that ends before it saved anything leaves its folder as it found it (``release_folder``)."""
        with contextlib.ExitStack() as held:
            self.check_run_folder(held)
            try:
                self.setup()
                self.train()
                return self.finish()
            except BaseException:
                self.release_folder()
                raise

    # -- 0. before loading anything ----------------------------------------------------------------
    def check_run_folder(self, held: contextlib.ExitStack) -> None:
        """Fail fast: a bad output folder, another run's files, a resume that does not fit."""
        t, cfg, output_dir = self.t, self.cfg, self.output_dir
        check_writable(output_dir)
        check_is_run_folder(output_dir)  # a model, heads, a user's files: never written over nor removed
        check_eval_source(cfg.data)  # never evaluate (and pick best/) on the training rows
        self.plan_prompt_texts()  # a bad train.plan_prompts file fails before anything loads
        if self.overwrite and t.resume is not None:
            raise RunFolderError("--overwrite and --resume (train.resume) contradict each other: choose one")
        abandoned = False
        if int(os.environ.get("RANK", "0")) == 0:  # one lock per run: the main process holds it for all
            lock = held.enter_context(RunLock(output_dir))
            if lock.took_over:
                main_print(f"took over the lock of an earlier run that no longer runs (pid {lock.took_over.get('pid')})")
            abandoned = lock.abandoned
        self.candidates = resume_candidates(t.resume, output_dir)
        if self.candidates:
            with contextlib.suppress(CheckpointError):  # unreadable: load_checkpoint reports it and falls back
                state = read_state(self.candidates[0])
                self.check_resume(self.candidates[0], state)
                self.check_not_past(self.candidates[0], state.get("step"), t.max_steps)
        elif not self.overwrite and guard_fresh_run(output_dir, False, t.resume, cfg.to_dict(), abandoned=abandoned):
            self.took_over_folder = True  # its config.json is this run's from now on (release_folder)
            main_print(f"{output_dir}: its earlier run never saved a step (only its config.json is there); "
                       "this run takes the folder over")

    def check_not_past(self, checkpoint: Path, step: Any, max_steps: int | None) -> None:
        """Refuse to resume a checkpoint beyond the step budget: there is nothing to train, and
        finishing would export the checkpoint's heads as if trained to ``max_steps``."""
        if isinstance(step, int) and max_steps is not None and step > max_steps:
            budget = f"train.max_steps={max_steps}" if self.t.max_steps is not None else f"{max_steps} steps ({self.t.num_epochs} epoch(s))"
            raise RunFolderError(
                f"{budget}, but the run in {self.output_dir} is already past it: its checkpoint {checkpoint} is at "
                f"step {step}, so there is nothing to train. Its exported heads (if it finished) are in "
                f"{self.output_dir / 'heads'}; to train on, raise train.max_steps above {step}; to train a "
                "shorter run, start over (--overwrite, or another train.output_dir)"
            )

    def check_resume(self, path: Path, state: dict[str, Any]) -> None:
        """Refuse a checkpoint written with another config (only the step budget may change)."""
        check_resume_config(path, state.get("config"), self.cfg.to_dict())

    # -- 1. setup ----------------------------------------------------------------------------------
    def setup(self) -> None:
        self.setup_accelerator()
        self.load_target_and_data()
        self.build_heads_and_optimizer()
        self.build_data_loaders()
        self.claim_folder()  # everything checkable has passed: only now does the run write its folder
        self.prepare_and_resume()

    def claim_folder(self) -> None:
        """Make the output folder this run's: clear the previous run's files (``--overwrite``) and
        write config.json. Called once every check that needs the target, data and heads passed, so
        a run refused for its settings has written nothing (and the run it would replace is intact)."""
        accelerator, output_dir = self.accelerator, self.output_dir
        accelerator.wait_for_everyone()  # every process has checked the folder before it changes
        if accelerator.is_main_process:
            output_dir.mkdir(parents=True, exist_ok=True)
            if self.overwrite:
                removed = clear_run(output_dir)
                if removed:
                    self.say(f"--overwrite: removed the previous run's {', '.join(removed)} from {output_dir}")
            self.wrote_config = self.took_over_folder or not (output_dir / "config.json").is_file()
            write_json_atomically(output_dir / "config.json", self.cfg.to_dict())
        accelerator.wait_for_everyone()

    def release_folder(self) -> None:
        """After a failure: if this run wrote the folder's config.json and saved nothing else (no
        checkpoint, heads, best/ or metrics), remove it, so that the folder does not read as a run
        that a rerun must --resume or --overwrite."""
        if not getattr(self, "wrote_config", False) or existing_run(self.output_dir) != ["config.json"]:
            return
        with contextlib.suppress(OSError):
            (self.output_dir / "config.json").unlink()

    def setup_accelerator(self) -> None:
        """The Accelerator (launcher-aware), the seed."""
        t, output_dir = self.t, self.output_dir
        log_with = prepare_tracker(self.cfg.tracking, announce=main_print)
        self.accelerator = accelerator = Accelerator(
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
        self.parallel = Parallelism(accelerator)
        self.say = accelerator.print
        set_seed(t.seed)
        threads = cpu_threads_for_single_process()
        if threads is not None:
            torch.set_num_threads(threads)
        self.say(
            f"draftheads: {accelerator.num_processes} process(es), {accelerator.distributed_type.value}, "
            f"device {accelerator.device}, mixed precision {accelerator.mixed_precision}"
            + (f", {threads} CPU threads" if threads is not None else "")
        )

    def load_target_and_data(self) -> None:
        """The frozen target and its tokenizer; the tokenized train/eval splits."""
        accelerator = self.accelerator
        texts = self.plan_prompt_texts()  # a bad prompt file fails now, not after training
        with self.timer("load_target"):
            self.target, self.tokenizer = load_target(self.cfg.target, accelerator, device=self.parallel.target_device())
        self.plan_prompts = self.encode_plan_prompts(texts)
        check_context(self.cfg.data.max_length, self.target.config, self.say)
        if self.cfg.data.packing:  # before the data is built: a hybrid target cannot keep packed documents apart
            check_packable(self.target)
        with self.timer("build_data"):
            with accelerator.main_process_first():
                self.train_ds, self.eval_ds, self.data_stats = build_datasets(self.cfg.data, self.tokenizer)
        self.say(self.data_stats.summary())

    def plan_prompt_texts(self) -> list[str] | None:
        """The texts of ``train.plan_prompts`` (checked: `data.plan_prompts`), or None when no plan
        is chosen. "auto" is resolved once the tokenizer says whether there is a chat template."""
        if not self.t.choose_tree or self.t.plan_prompts == AUTO_PROMPTS:
            return None
        return read_prompt_texts(self.t.plan_prompts, "train.plan_prompts")

    def encode_plan_prompts(self, texts: list[str] | None) -> list[torch.Tensor] | None:
        """The plan prompts as the target sees a user's request (1-D token rows)."""
        if not self.t.choose_tree:
            return None
        chat = bool(getattr(self.tokenizer, "chat_template", None))
        if texts is None:
            name = default_plan_set(chat)
            texts = read_prompt_texts(name, "train.plan_prompts")
            self.say(f"plan prompts: the package's {name!r} set ({len(texts)} prompts)")
        else:
            self.say(f"plan prompts: {self.t.plan_prompts} ({len(texts)} prompts)")
        return [ids[0] for ids in encode_prompts(self.tokenizer, texts, chat, PLAN_PROMPT_TOKENS)]

    def build_heads_and_optimizer(self) -> None:
        """Heads (initialised as heads.init says), the wrapper module, AdamW on the heads only."""
        cfg, t, say, target = self.cfg, self.t, self.say, self.target
        set_seed(t.seed)  # heads' init does not depend on what loading consumed from the RNG
        self.parallel.check_heads(cfg.heads)
        heads = build_heads(cfg.heads, target, zero3=self.parallel.zero3, tokenizer=self.tokenizer)
        if cfg.heads.init_from:  # continue from saved or imported heads (their draft vocabulary included)
            heads = init_heads_from(heads, cfg.heads.init_from, target)
            say(f"heads initialised from {cfg.heads.init_from}")
        settled = heads.settle_tokenizer(self.tokenizer)  # e.g. a mask token, checked against the tokenizer
        if settled:
            say(settled)
        if getattr(heads, "mask_token_id", None) is not None:  # P-EAGLE, DFlash: never a token of the rows
            check_mask_token_absent(int(heads.mask_token_id), {"training": self.train_ds, "evaluation": self.eval_ds},
                                    self.tokenizer)
        if not cfg.heads.init_from and heads.own_draft_vocabulary:  # its own LM head covers the most frequent training tokens
            heads.set_draft_vocab(training_token_counts(self.train_ds, heads.config.vocab_size))
            say(f"draft vocabulary: the {heads.draft_to_target.numel()} most frequent training tokens")
            if cfg.heads.lm_head_init == "target":
                say(start_lm_head_from_target(heads, target, zero3=self.parallel.zero3))
        self.heads = heads
        self.model = TargetWithHeads(
            target, heads, loss_decay=t.loss_decay, loss_chunk_size=t.loss_chunk_size, topk=t.topk, labels=t.labels,
            checkpoint_loss_chunks=t.loss_checkpointing,
        )
        self.params = self.model.trainable_parameters()
        say(
            f"heads: {cfg.heads.head_type} x{heads.config.num_heads}, {heads.config.num_layers} layer(s), "
            f"lm_head {heads.config.lm_head}; {sum(p.numel() for p in self.params) / 1e6:.2f} M trainable parameters "
            f"(target {sum(self.parallel.numel(p) for p in target.parameters()) / 1e6:.1f} M, frozen)"
        )
        self.optimizer = build_optimizer(self.params, t)

    def build_data_loaders(self) -> None:
        """Train batches (reshuffled per epoch, or grouped by length), this process's eval shard,
        and the step budget they imply; the schedule over that budget."""
        cfg, t, accelerator = self.cfg, self.t, self.accelerator
        collator = Collator.from_tokenizer(self.tokenizer)
        check_something_to_learn(self.model, self.train_ds, collator, cfg.heads)  # rows, as documents
        if cfg.data.features == AUTO:  # written here on first use, then reused (checkpoints keep "auto")
            cfg = self.build_auto_feature_cache(collator)
        if cfg.data.features:  # the target's features come from an offline cache (draftheads cache-features)
            self.train_ds, self.eval_ds, collator = open_cache(
                cfg, self.target, self.tokenizer, self.heads, self.train_ds, self.eval_ds, collator
            )
            self.say(f"target features: read from the cache {cfg.data.features} (the target is not run)")
        train_collator = collator  # evaluation keeps the row collator (its figures compare across runs)
        if cfg.data.packing:  # rows laid end to end in windows, documents kept apart (train/packing.py)
            self.train_ds, train_collator = pack_for_training(
                cfg, self.target, self.train_ds, collator, self.say, check_target=not self.parallel.zero3
            )
        sampler = EpochShuffleSampler(len(self.train_ds), seed=t.seed)
        if t.group_by_length:  # batches of similar lengths: less padding (draftheads/data/sampling.py)
            sampler = LengthGroupedSampler(example_lengths(self.train_ds), t.batch_size, seed=t.seed)
        self.train_dl = DataLoader(self.train_ds, batch_size=t.batch_size, sampler=sampler, collate_fn=train_collator)
        self.eval_dl = None
        eval_ds = self.eval_ds
        if eval_ds is not None and len(eval_ds) > 0:
            if t.eval_batches:  # a fixed subset, always iterated to the end (no early break)
                eval_ds = eval_ds.select(range(min(len(eval_ds), t.eval_batches * t.batch_size * accelerator.num_processes)))
            self.eval_dl = DataLoader(
                EvalShard(eval_ds, accelerator.process_index, accelerator.num_processes),
                batch_size=t.batch_size, shuffle=False, collate_fn=collator,
            )  # fmt: skip
        self.eval_ds = eval_ds
        self.batches_per_epoch = math.ceil(math.ceil(len(self.train_ds) / t.batch_size) / accelerator.num_processes)
        self.steps_per_epoch = math.ceil(self.batches_per_epoch / t.grad_accum)
        self.max_steps = t.max_steps or self.steps_per_epoch * t.num_epochs
        self.scheduler = build_scheduler(self.optimizer, t, self.max_steps)

    def build_auto_feature_cache(self, collator) -> ExperimentConfig:
        """``data.features: auto``: the cache folder of these inputs, written by the main process
        if it is not complete yet; a copy of the config with that folder in ``data.features``."""
        accelerator = self.accelerator
        splits = {"train": self.train_ds} | ({"eval": self.eval_ds} if self.eval_ds is not None else {})
        directory = auto_cache_dir(fingerprint(self.cfg, self.target, self.tokenizer, self.heads, splits))
        if accelerator.is_main_process:
            with self.timer("feature_cache"), exclusive_lock(directory):
                build_cache(
                    self.cfg, directory, self.model, self.tokenizer, splits, collate=collator,
                    progress=accelerator.is_main_process, say=self.say,
                )
        accelerator.wait_for_everyone()
        return dataclasses.replace(self.cfg, data=dataclasses.replace(self.cfg.data, features=str(directory)))

    def prepare_and_resume(self) -> None:
        """accelerator.prepare; then, if asked, where a checkpoint left off; the trackers."""
        t, accelerator = self.t, self.accelerator
        self.parallel.before_prepare(self.model, t.max_grad_norm)
        if self.parallel.fsdp:  # FSDP replaces the heads' parameters: the optimizer must hold the new ones
            self.model = accelerator.prepare(self.model)
            self.optimizer = build_optimizer(self.parallel.optimizer_parameters(self.model, self.params), t)
            self.scheduler = build_scheduler(self.optimizer, t, self.max_steps)
            self.optimizer, self.train_dl, self.scheduler = accelerator.prepare(self.optimizer, self.train_dl, self.scheduler)
        else:
            self.model, self.optimizer, self.train_dl, self.scheduler = accelerator.prepare(
                self.model, self.optimizer, self.train_dl, self.scheduler
            )
        assert len(self.train_dl) == self.batches_per_epoch, (len(self.train_dl), self.batches_per_epoch)
        layout = self.parallel.describe(self.model)
        if layout:
            self.say(layout)
        self.core = accelerator.unwrap_model(self.model)  # TargetWithHeads, under any wrapper
        self.best = BestHeads(self.output_dir / "best")
        self.window = TrainWindow(self.heads.config.num_heads, accelerator.device)  # statistics since the last log line
        if self.candidates:
            self.resume()
        elif t.resume == "auto":
            self.say(f"resume=auto: no checkpoint in {self.output_dir / 'checkpoints'} yet, starting fresh")
        init_trackers(accelerator, self.cfg.tracking, self.cfg.to_dict(), self.output_dir, run_id=self.tracker_run)
        self.tracker_run = tracker_run_id(accelerator, self.cfg.tracking) or self.tracker_run
        if self.step >= self.max_steps:  # resumed at the last step (killed while finishing): finish only
            self.say(f"the checkpoint is at step {self.step} = the step budget: nothing left to train; "
                     "finishing the run (final evaluation, export)")
            return
        self.say(
            f"training {self.max_steps} steps ({self.steps_per_epoch} per epoch): batch {t.batch_size} x accum "
            f"{t.grad_accum} x {accelerator.num_processes} process(es), lr {t.lr}, warmup {t.warmup_steps}, "
            f"{t.lr_schedule} schedule, AdamW betas {tuple(t.adam_betas)}, clip {t.max_grad_norm or 'off'}"
        )

    def resume(self) -> None:
        """Heads, optimizer, schedule and RNG from the newest loadable checkpoint; the step, the data
        position, best/, the tracker's run and the history metrics.json reports (it covers the
        whole run, not only the part after the resume). A run that finished at the checkpoint's
        step and now trains on (a larger ``train.max_steps``) keeps its final evaluation there, as
        the evaluation of that step."""
        accelerator = self.accelerator
        self.parallel.before_resume(self.optimizer)
        with self.timer("resume"):
            checkpoint, state = load_checkpoint(accelerator, self.candidates, self.model, check=self.check_resume, say=self.say)
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batches_in_epoch"]
        self.best.restore(state.get("best"))
        if state.get("num_processes", accelerator.num_processes) != accelerator.num_processes:
            self.say(f"warning: {checkpoint} was written by {state['num_processes']} processes; the data order will differ")
        self.check_not_past(checkpoint, self.step, self.max_steps)  # a budget in epochs is known only now
        self.say(f"resumed from {checkpoint}: step {self.step}, epoch {self.epoch}, {self.batch_in_epoch} batches into the epoch")
        self.last_saved = self.step
        self.evals = list(state.get("evals") or [])
        finished = state.get("final_eval")
        if finished and self.step < self.max_steps:  # else finish() evaluates this step again
            self.evals.append(finished)
        self.tracker_run = state.get("tracker_run")
        self.window.total_tokens = int(state.get("train_tokens", 0))
        self.window.total_seconds = float(state.get("train_seconds", 0.0))

    # -- 2. train ----------------------------------------------------------------------------------
    def train(self) -> None:
        """Epochs of optimizer steps until ``max_steps``; a resumed run first skips the batches its
        checkpoint had already trained on."""
        self.progress = progress_bar(self.max_steps, self.step, self.accelerator)
        self.label_counts = torch.zeros_like(self.heads.token_counts)  # this process's, since the last merge
        self.guard = NonFiniteGuard(1 if self.parallel.deepspeed else MAX_NONFINITE_STEPS)
        self.model.train()
        train_start = time.perf_counter()
        skip = self.batch_in_epoch
        while self.step < self.max_steps:
            self.train_dl.set_epoch(self.epoch)  # seeds this epoch's shuffle (also inside skip_first_batches)
            batches = iter(self.accelerator.skip_first_batches(self.train_dl, skip) if skip else self.train_dl)
            self.batch_in_epoch, skip = skip, 0
            if not self.train_epoch(batches):
                break
            self.epoch += 1  # the epoch ran out before max_steps
        self.timer.add("train", time.perf_counter() - train_start)
        self.progress.close()

    def train_epoch(self, batches) -> bool:
        """Steps over ``batches`` until they or the step budget run out; True if they ran out."""
        while self.step < self.max_steps:
            # One optimizer step: grad_accum micro-batches (fewer at the end of an epoch), drawn
            # first so the loss can be normalised by the step's token count on every process.
            group = list(itertools.islice(batches, self.t.grad_accum))
            if not group:
                return True
            self.train_step(group)
            self.after_step()
        return False

    def train_step(self, group: list[dict[str, torch.Tensor]]) -> None:
        """One optimizer step over the micro-batches of ``group``."""
        t, accelerator, model = self.t, self.accelerator, self.model
        denominators = step_denominators(accelerator, self.core, group, t.grad_accum)
        accelerator.step = t.grad_accum - len(group)  # accumulate() syncs at the group's last batch
        for batch in group:
            self.core.reseed_noise(noise_seed(t.seed, accelerator.process_index, self.epoch, self.batch_in_epoch), accelerator.device)
            with accelerator.accumulate(model):
                out = model(**batch, loss_denominators=denominators)
                accelerator.backward(out["loss"])
                self.guard.add(out["loss"])
                if accelerator.sync_gradients and self.guard.step_is_bad(accelerator, self.step + 1, self.scheduler.get_last_lr()[0]):
                    pass  # a non-finite loss somewhere: no update (stability.py)
                else:
                    if accelerator.sync_gradients and t.max_grad_norm:
                        accelerator.clip_grad_norm_(self.parallel.clip_parameters(model, self.params), t.max_grad_norm)
                    self.optimizer.step()  # no-op between accumulation boundaries
                self.optimizer.zero_grad(set_to_none=True)
            self.batch_in_epoch += 1
            self.window.add(out, scale=t.grad_accum * accelerator.num_processes)
            self.label_counts += out["label_counts"]
        assert accelerator.sync_gradients, "the last micro-batch of a step must sync"
        self.scheduler.step()
        self.step += 1
        self.window.steps += 1
        self.progress.update(1)

    def after_step(self) -> None:
        """Log, evaluate and checkpoint when their turn comes."""
        t, step = self.t, self.step
        if step % t.log_every == 0 or step == self.max_steps:
            self.log_training()
        if self.eval_dl is not None and t.eval_every and step % t.eval_every == 0 and step < self.max_steps:
            self.evals.append(self.evaluate(self.progress))
            self.best.offer(self.accelerator, self.model, self.heads, self.label_counts, self.evals[-1])
            self.window.restart_clock()  # evaluation time is not training throughput
        if t.save_every and step % t.save_every == 0:
            self.save()
            self.window.restart_clock()

    def log_training(self) -> None:
        """The steps since the last log line: to the trackers, the progress bar and stdout."""
        logs = self.window.flush(self.accelerator, self.t.topk)
        logs["train/lr"] = self.scheduler.get_last_lr()[0]
        logs["train/epoch"] = self.epoch + self.batch_in_epoch / self.batches_per_epoch
        self.accelerator.log(logs, step=self.step)
        self.progress.set_postfix(loss=f"{logs['train/loss']:.3f}", tok_s=f"{logs['train/tokens_per_second']:.0f}")
        write_line(self.progress, train_line(self.step, self.max_steps, logs))

    # -- 3. evaluate -------------------------------------------------------------------------------
    def evaluate(self, progress=None) -> dict[str, Any]:
        """The eval set's figures at this step, logged and printed (a collective)."""
        return evaluate_and_log(
            self.accelerator, self.model, self.eval_dl, self.t, self.heads.config.num_heads, self.step, progress
        )

    # -- 4. save -----------------------------------------------------------------------------------
    def save(self) -> None:
        """A resumable checkpoint of this step (a collective). The label counts are merged into
        the heads first, so the checkpoint carries them."""
        merge_label_counts(self.accelerator, self.heads, self.label_counts)
        save_checkpoint(self.accelerator, self.output_dir, self.step, self.trainer_state())
        self.last_saved = self.step

    def trainer_state(self, final_eval: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a checkpoint records besides the weights: where the data stands, best/, the
        history metrics.json reports (with ``final_eval``, the run's final evaluation at this
        step), the tracker's run and the config a resume compares against (a collective: the
        trained tokens are summed over processes)."""
        epoch, batches = data_position(self.epoch, self.batch_in_epoch, self.batches_per_epoch)
        accelerator = self.accelerator
        return {
            "evals": self.evals,
            "final_eval": final_eval or None,
            "train_tokens": self.window.tokens_so_far(accelerator),
            "train_seconds": self.window.total_seconds,
            "step": self.step,
            "epoch": epoch,
            "batches_in_epoch": batches,
            "max_steps": self.max_steps,
            "num_processes": accelerator.num_processes,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "best": self.best.as_dict(),
            "tracker_run": self.tracker_run,
            "config": self.cfg.to_dict(),  # what a resume compares against (run_dir.check_resume_config)
        }

    # -- 5. finish ---------------------------------------------------------------------------------
    def finish(self) -> TrainResult:
        """Last checkpoint, final evaluation (recorded in that checkpoint, with the best/ it
        chose: a resume with a larger step budget continues the run's history), the exported
        heads and their tree, metrics.json."""
        accelerator = self.accelerator
        merge_label_counts(accelerator, self.heads, self.label_counts)
        if self.t.save_every and self.last_saved != self.step:  # before the evaluation: a kill there resumes here
            save_checkpoint(accelerator, self.output_dir, self.step, self.trainer_state())
        final_eval: dict[str, Any] = {}
        if self.eval_dl is not None:
            with self.timer("eval"):
                final_eval = self.evaluate()
            with self.timer("export"):
                self.best.offer(accelerator, self.model, self.heads, self.label_counts, final_eval)
            if self.t.save_every:
                record_state(accelerator, self.output_dir, self.step, self.trainer_state(final_eval))
        heads_dir = self.output_dir / "heads"
        with self.timer("export"):
            export_heads(accelerator, self.model, heads_dir)
        trained_heads = self.parallel.whole_heads(self.model)
        with self.timer("choose_tree"):
            chosen_tree = self.choose_tree(heads_dir, final_eval, self.parallel.model_for_tree(self.model, trained_heads))
        metrics = self.metrics(final_eval, chosen_tree)
        if accelerator.is_main_process:
            write_json_atomically(self.output_dir / "metrics.json", metrics, default=float)
            write_run_cards(self.output_dir, self.cfg.to_dict(), metrics)  # README.md: what the heads are, how to serve them
            self.say(f"heads exported to {heads_dir}")
        self.teardown()
        return TrainResult(output_dir=self.output_dir, heads_dir=heads_dir, step=self.step, metrics=metrics, heads=trained_heads)

    def choose_tree(self, heads_dir: Path, final_eval: dict[str, Any], model: torch.nn.Module) -> Any:
        """The heads leave training ready to decode fast: their tree (and draft vocabulary) is
        chosen, by decoding with ``model``, and written next to them by ``write_export_tree``,
        the one call into it."""
        sample_ds = self.eval_ds if self.eval_ds is not None and len(self.eval_ds) else self.train_ds
        rows = [torch.as_tensor(sample_ds[i]["input_ids"]) for i in range(min(SAMPLE_ROWS, len(sample_ds)))]
        skip = None if self.t.choose_tree else "train.choose_tree is false; `draftheads calibrate` chooses one later"
        return write_export_tree(
            self.accelerator, model, heads_dir, rows, final_eval.get("eval/rank_accuracy"),
            skip_reason=skip or self.parallel.tree_skip_reason(), try_lookup=self.t.choose_prompt_lookup,
            prompts=self.plan_prompts,
        )  # fmt: skip

    def metrics(self, final_eval: dict[str, Any], chosen_tree: Any) -> dict[str, Any]:
        """What metrics.json says about the whole run."""
        window = self.window
        return {
            "step": self.step,
            "max_steps": self.max_steps,
            "num_processes": self.accelerator.num_processes,
            "distributed_type": self.accelerator.distributed_type.value,
            "final_eval": final_eval,
            "evals": self.evals,
            # the evaluation whose heads are in best/ (highest eval/simulated_acceptance); None without eval
            "best": self.best.as_dict(),
            "train_tokens": window.total_tokens,
            # seconds spent in training steps (evaluation and checkpoint time excluded), and the
            # tokens per such second: over the whole run, like train_tokens, however often it resumed
            "train_seconds": window.total_seconds,
            "train_tokens_per_second": window.total_tokens / window.total_seconds if window.total_seconds else 0.0,
            "stage_seconds": self.timer.seconds,  # this process's stages (a resumed run's: since it resumed)
            "data": self.data_stats.as_dict(),
            "tree": chosen_tree,  # what write_export_tree put in heads/tree.json (None: device default)
        }

    def teardown(self) -> None:
        """Wait for every process, end the trackers and leave the process group cleanly (without
        this, about one multi-process CPU run in three aborts at exit), then reset accelerate's
        singletons so another run can start in the same process."""
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()  # also destroys the process group in accelerate >= 1.x
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
