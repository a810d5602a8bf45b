"""Training reliability: one run per output folder, resume only under the same config, diverged
runs stop without exporting, and the shared `train` entry's error handling."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
import yaml

from draftheads import MedusaHeads
from draftheads.train.run_dir import RunFolderError
from draftheads.train.stability import NonFiniteGuard, TrainingDiverged
from test_train import _cfg, keyless_wandb


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _steps(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir())


# ---------------------------------------------------------------------------------------------
# One run per output folder
# ---------------------------------------------------------------------------------------------


def test_fresh_run_into_a_folder_with_a_run_is_refused(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    first = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=0)
    run(first)
    out = Path(first.train.output_dir)
    before = (out / "heads" / "model.safetensors").read_bytes()

    again = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=1, eval_every=0)
    with pytest.raises(RunFolderError, match="already holds a run") as err:
        run(again)
    assert str(out) in str(err.value) and "--resume" in str(err.value) and "--overwrite" in str(err.value)
    assert _steps(out) == ["step-2", "step-4"]  # untouched
    assert (out / "heads" / "model.safetensors").read_bytes() == before

    # resume=auto in a folder whose run kept no checkpoint: nothing to continue, refused as well
    no_ckpt = _cfg(tmp_path / "n", tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=0, eval_every=0)
    run(no_ckpt)
    no_ckpt.train.resume = "auto"
    with pytest.raises(RunFolderError, match="no checkpoint to resume from"):
        run(no_ckpt)


def test_overwrite_replaces_only_the_previous_runs_files(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    first = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=2)
    run(first)
    out = Path(first.train.output_dir)
    assert (out / "best").is_dir()
    (out / "notes.txt").write_text("mine")

    second = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=1, eval_every=0)
    result = run(second, overwrite=True)
    assert result.step == 2
    assert _steps(out) == ["step-1", "step-2"]  # the old step-4 cannot outlive the new run's checkpoints
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["step"] == 2 and metrics["best"]["step"] == 2  # best/ is this run's, not the old step-4
    assert (out / "notes.txt").read_text() == "mine"

    second.train.resume = "auto"
    with pytest.raises(RunFolderError, match="contradict"):
        run(second, overwrite=True)


def test_resume_refuses_a_checkpoint_written_with_another_config(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=2, eval_every=0)
    run(cfg)
    other = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "heads.num_layers=2",
                 max_steps=4, save_every=2, eval_every=0, lr=5e-3, resume="auto")  # fmt: skip
    with pytest.raises(RunFolderError, match="another config") as err:
        run(other)
    assert "heads.num_layers" in str(err.value) and "train.lr" in str(err.value)
    assert "train.max_steps: " not in str(err.value)  # the step budget is not a difference

    # the step budget may change: continue the same run to 4 steps
    more = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=0, resume="auto")
    assert run(more).step == 4
    assert _steps(Path(cfg.train.output_dir)) == ["step-2", "step-4"]


_HOLD_LOCK = """
import sys, time
from draftheads.train.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_run_into_a_running_runs_folder_is_refused_at_once(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    """A running run may not have written anything yet (a real target loads for minutes): its
    lock, not its files, must stop the second run, before the second loads anything."""
    import os
    import signal
    import subprocess
    import sys

    from draftheads.train import loop, trainer
    from draftheads.train.run_lock import LOCK_NAME

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0)
    out = Path(cfg.train.output_dir)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    first = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().strip() == "locked"

        def no_loading(*args, **kwargs):
            raise AssertionError("the second run loaded its target instead of being refused")

        with monkeypatch.context() as m:
            m.setattr(trainer, "load_target", no_loading)
            with pytest.raises(RunFolderError, match="in use by another run") as err:
                loop.run(cfg)
        assert f"pid {first.pid} on " in str(err.value) and "started 20" in str(err.value)
        assert not (out / "config.json").exists()  # the second run wrote nothing
    finally:
        first.send_signal(signal.SIGKILL)  # killed: its lock file stays behind
        first.wait()
    assert (out / LOCK_NAME).is_file()
    result = loop.run(cfg)  # a dead run's lock does not block
    assert result.step == 1 and not (out / LOCK_NAME).exists()  # and a finished run leaves none


def test_a_folder_with_only_another_runs_config_is_refused(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """config.json is the first file a run writes: a run started elsewhere shows by it alone."""
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=1)
    out = Path(cfg.train.output_dir)
    out.mkdir(parents=True)
    other = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=0)
    (out / "config.json").write_text(json.dumps(other.to_dict()))
    with pytest.raises(RunFolderError, match=r"already holds a run \(config.json\)"):
        run(cfg)
    with pytest.raises(RunFolderError, match="no checkpoint to resume from"):  # resume=auto: not this run's config
        run(_cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=1, resume="auto"))
    # the same run, killed before its first checkpoint and requeued with resume=auto, starts fresh
    again = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=1, resume="auto")
    (out / "config.json").write_text(json.dumps(again.to_dict()))
    assert run(again).step == 1


def test_a_resumed_runs_metrics_equal_the_uninterrupted_runs(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    """Killed after the step-4 checkpoint of 6 steps, resumed: the eval history and the trained
    token count of metrics.json cover the whole run (they were lost: evals [] and the tokens of
    the resumed part only). log_every=3 leaves tokens unlogged at the checkpoint."""
    from draftheads.train import loop, trainer

    common = dict(max_steps=6, eval_every=2, save_every=2, log_every=3)
    straight = loop.run(_cfg(tmp_path / "straight", tiny_target_dir, tiny_text_jsonl, **common)).metrics

    real_save = trainer.save_checkpoint

    def killed_after_step_4(accelerator, output_dir, step, state):
        path = real_save(accelerator, output_dir, step, state)
        if step == 4:
            raise KeyboardInterrupt("killed")
        return path

    cfg = _cfg(tmp_path / "resumed", tiny_target_dir, tiny_text_jsonl, **common)
    with monkeypatch.context() as m:
        m.setattr(trainer, "save_checkpoint", killed_after_step_4)
        with pytest.raises(KeyboardInterrupt):
            loop.run(cfg)
    cfg.train.resume = "auto"
    resumed = json.loads((Path(cfg.train.output_dir) / "metrics.json").read_text()) if loop.run(cfg) else None
    assert [e["step"] for e in straight["evals"]] == [2, 4]
    assert resumed["evals"] == json.loads(json.dumps(straight["evals"]))
    assert resumed["train_tokens"] == straight["train_tokens"] > 0
    assert resumed["final_eval"] == json.loads(json.dumps(straight["final_eval"]))
    assert resumed["best"]["step"] == straight["best"]["step"]


def _same_folder(value, folder: Path, name: str):
    """``value`` with the run folder's path written as ``name``: two runs differ only there."""
    return json.loads(json.dumps(value, default=float).replace(str(folder), name))


# metrics.json's wall times: the extended run's stage_seconds are its second process's stages (a
# "resume" among them); its training seconds (both legs') and so its throughput are other seconds
WALL_TIMES = {"stage_seconds", "train_seconds", "train_tokens_per_second"}


def test_an_extended_runs_metrics_equal_the_uninterrupted_runs(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """Trained to step 4, then resumed with a larger budget (train.max_steps=8): metrics.json is
    one 8-step run's, field by field, wall times apart. The first leg's final evaluation is the
    step-4 evaluation the uninterrupted run makes; it was lost (evals at steps [2, 6] for [2, 4, 6]),
    and best/ was chosen without it. A constant schedule, so that both runs take the same steps
    (a decaying one is planned over the budget: the first leg's decays over 4 steps)."""
    from draftheads.train import loop

    common = dict(eval_every=2, save_every=2, log_every=2, lr_schedule="constant")
    straight_cfg = _cfg(tmp_path / "straight", tiny_target_dir, tiny_text_jsonl, max_steps=8, **common)
    straight = _same_folder(loop.run(straight_cfg).metrics, Path(straight_cfg.train.output_dir), "RUN")
    first = _cfg(tmp_path / "extended", tiny_target_dir, tiny_text_jsonl, max_steps=4, **common)
    loop.run(first)
    out = Path(first.train.output_dir)
    assert [e["step"] for e in json.loads((out / "metrics.json").read_text())["evals"]] == [2]
    loop.run(_cfg(tmp_path / "extended", tiny_target_dir, tiny_text_jsonl, max_steps=8, resume="auto", **common))
    extended = _same_folder(json.loads((out / "metrics.json").read_text()), out, "RUN")

    assert [e["step"] for e in straight["evals"]] == [2, 4, 6]
    assert extended.keys() == straight.keys()
    for key in sorted(straight.keys() - WALL_TIMES):
        assert extended[key] == straight[key], key
    assert extended["train_seconds"] > 0 and "resume" in extended["stage_seconds"]


def test_a_resumed_run_continues_its_wandb_run(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    """Extended with --resume, a run logs on into the W&B run it started (it started a second
    one). Offline, each process's part is a folder named by the run's id; `wandb sync` uploads
    them into that one run, in order."""
    from draftheads.train import loop

    runs = keyless_wandb(monkeypatch, tmp_path)
    common = dict(eval_every=0, save_every=2)
    loop.run(_cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "tracking.report_to=wandb", max_steps=2, **common))
    loop.run(_cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "tracking.report_to=wandb", max_steps=4, resume="auto",
                  **common))  # fmt: skip
    # offline-run-<time>-<id>, with "-1" after it where two parts start in the same second
    ids = {folder.name.split("-")[3] for folder in runs.rglob("offline-run-*")}
    assert len(ids) == 1, ids


# ---------------------------------------------------------------------------------------------
# A diverged run
# ---------------------------------------------------------------------------------------------


class _Acc:
    device = torch.device("cpu")

    @staticmethod
    def reduce(t, reduction="sum"):
        return t

    @staticmethod
    def print(*args):
        print(*args)


def test_guard_skips_a_single_bad_step_and_stops_after_three_in_a_row():
    guard = NonFiniteGuard(3)
    guard.add(torch.tensor(float("nan")))
    assert guard.step_is_bad(_Acc, 1, 1e-3)
    guard.add(torch.tensor(1.0))
    assert not guard.step_is_bad(_Acc, 2, 1e-3) and guard.consecutive == 0
    for step in (3, 4):
        guard.add(torch.tensor(float("inf")))
        assert guard.step_is_bad(_Acc, step, 1e-3)
    guard.add(torch.tensor(float("nan")))
    with pytest.raises(TrainingDiverged, match="3 consecutive"):
        guard.step_is_bad(_Acc, 5, 1e-3)


def test_diverged_run_stops_nonzero_and_exports_nothing(tmp_path, tiny_target_dir, tiny_text_jsonl, capsys, monkeypatch):
    from draftheads.train import trainer
    from draftheads.train.command import add_arguments, run_command

    real_optimizer = trainer.build_optimizer

    def poisoned(params, t):  # every update leaves NaN weights (what train.lr=.inf did; the config refuses it now)
        optimizer = real_optimizer(params, t)
        real_step = optimizer.step

        def step(self, *args, **kwargs):
            out = real_step(*args, **kwargs)
            with torch.no_grad():
                for group in self.param_groups:
                    for p in group["params"]:
                        p.fill_(float("nan"))
            return out

        optimizer.step = types.MethodType(step, optimizer)  # a bound method, as accelerate expects
        return optimizer

    monkeypatch.setattr(trainer, "build_optimizer", poisoned)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=8, eval_every=1, save_every=0)
    config_file = tmp_path / "diverge.yaml"
    config_file.write_text(yaml.safe_dump(cfg.to_dict()))
    import argparse

    args = add_arguments(argparse.ArgumentParser()).parse_args(["--config", str(config_file)])
    assert run_command(args) == 1
    printed = capsys.readouterr()
    assert "training diverged" in printed.err and "3 consecutive" in printed.err
    out = Path(cfg.train.output_dir)
    assert not (out / "heads").exists() and not (out / "best").exists()
    assert not (out / "metrics.json").exists()
    # the evaluations after the first update saw NaN weights: their loss is reported as such
    assert "eval @ 1 | loss nan" in printed.out


def test_export_refuses_non_finite_weights(tmp_path, tiny_llama):
    heads = MedusaHeads.for_target(tiny_llama, num_heads=2)
    with torch.no_grad():
        next(heads.parameters())[0, 0] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        heads.save_pretrained(tmp_path / "h")
    assert not (tmp_path / "h").exists()


# ---------------------------------------------------------------------------------------------
# Checkpoints: disk full, truncated files, RNG states that do not load
# ---------------------------------------------------------------------------------------------


def test_disk_full_during_a_checkpoint_leaves_nothing_behind(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    import errno

    import accelerate.checkpointing as ac

    from draftheads.train.checkpoint import CheckpointError
    from draftheads.train.loop import run

    real_save = ac.save

    def save(obj, f, *args, **kwargs):  # the optimizer/scheduler/RNG writer inside save_state
        if "step-4" in str(f):
            Path(f).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ac, "save", save)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=0)
    with pytest.raises(CheckpointError, match="disk is full") as err:
        run(cfg)
    assert "step-4" in str(err.value) and "intact" in str(err.value)
    root = Path(cfg.train.output_dir) / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-2"]  # no .step-4.tmp-*, no half step-4


@pytest.mark.parametrize("damage", ["model.safetensors", "optimizer.bin", "trainer_state.json", "random_states_0.pkl"])
def test_unreadable_latest_checkpoint_falls_back_to_the_previous(tmp_path, tiny_target_dir, tiny_text_jsonl, damage, capsys):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=0)
    run(cfg)
    out = Path(cfg.train.output_dir)
    file = out / "checkpoints" / "step-4" / damage
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])  # truncated, as by a full disk or a killed copy
    capsys.readouterr()

    more = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=6, save_every=2, eval_every=0, resume="auto")
    result = run(more)
    printed = capsys.readouterr().out
    assert result.step == 6
    assert f"checkpoint {out / 'checkpoints' / 'step-4'} cannot be loaded" in printed and damage in printed
    assert f"resumed from {out / 'checkpoints' / 'step-2'}: step 2" in printed
    if damage == "random_states_0.pkl":
        assert "would not be bit-exact" in printed


def test_unloadable_rng_state_refuses_an_explicit_resume(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.checkpoint import CheckpointError
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=2, eval_every=0)
    run(cfg)
    ckpt = Path(cfg.train.output_dir) / "checkpoints" / "step-2"
    (ckpt / "random_states_0.pkl").write_bytes(b"not a pickle")
    again = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=0, resume=str(ckpt))
    with pytest.raises(CheckpointError, match="random_states_0.pkl does not load.*not be bit-exact"):
        run(again)


# ---------------------------------------------------------------------------------------------
# Evaluation rows never the training rows
# ---------------------------------------------------------------------------------------------


def test_eval_split_on_a_local_file_is_refused(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "data.eval_split=validation", max_steps=2)
    with pytest.raises(ValueError, match="local file has no named splits.*eval_fraction"):
        run(cfg)
    same = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, f"data.eval_path={tiny_text_jsonl}", max_steps=2)
    with pytest.raises(ValueError, match="eval_path is the training file"):
        run(same)
    assert not (tmp_path / "run").exists()  # refused before anything was loaded or written


# ---------------------------------------------------------------------------------------------
# The loss is a mean over the step's tokens, however they fall into micro-batches
# ---------------------------------------------------------------------------------------------


def _step_gradients(cfg) -> list[list[torch.Tensor]]:
    """The gradient every optimizer step of ``run(cfg)`` applies (after clipping), in float64:
    what the update is computed from, whatever the optimizer."""
    from draftheads.train.loop import run

    steps: list[list[torch.Tensor]] = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        steps.append([g.detach().double().clone() for g in grads])

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    handle = register_optimizer_step_pre_hook(record)
    try:
        run(cfg)
    finally:
        handle.remove()
    return steps


@pytest.mark.parametrize("head_type", ["medusa", "eagle"])
def test_update_does_not_depend_on_the_micro_batch_split(tmp_path, tiny_target_dir, tiny_text_jsonl, head_type):
    """4 steps of 8 rows each: one micro-batch of 8 vs two of 4 (grad_accum 2). The rows and their
    padding differ per micro-batch, so a per-micro-batch mean would weight tokens differently.

    Compared: the gradient each step hands the optimizer, the quantity the claim is about. The
    weights after a few Adam steps are not: Adam divides by sqrt(v), so a gradient element near 0
    turns float32 reduction-order noise (which differs between CPUs' vector widths) into a full
    lr-sized step. The learning rate is tiny so both runs see the same parameters at every step,
    and each step's gradient is compared, relative to the tensor's largest gradient."""
    extra = () if head_type == "medusa" else ("heads.head_type=eagle", "heads.lm_head=auto", "heads.noise=0")
    common = dict(max_steps=4, eval_every=0, save_every=0, warmup_steps=0, lr=1e-12)
    one = _cfg(tmp_path / "one", tiny_target_dir, tiny_text_jsonl, *extra, batch_size=8, grad_accum=1, **common)
    two = _cfg(tmp_path / "two", tiny_target_dir, tiny_text_jsonl, *extra, batch_size=4, grad_accum=2, **common)
    a, b = _step_gradients(one), _step_gradients(two)
    assert len(a) == len(b) == 4 and len(a[0]) == len(b[0]) > 0
    # a parameter behind a zero-initialised one (EAGLE's layer) gets no gradient at step 1; every
    # parameter must get one at some step, or its comparison would be vacuous
    assert all(any(bool(g[i].abs().max() > 0) for g in a) for i in range(len(a[0]))), "a parameter never got a gradient"
    for step, (ga, gb) in enumerate(zip(a, b), start=1):
        for i, (x, y) in enumerate(zip(ga, gb)):
            scale = float(x.abs().max())
            if scale == 0:
                assert float(y.abs().max()) == 0, f"step {step}, parameter {i}: a gradient in one split only"
                continue
            worst = float((x - y).abs().max()) / scale
            assert worst < 1e-4, f"step {step}, parameter {i}: gradients differ by {worst:.2e} of their scale"


def test_eval_shards_count_every_row_once_and_have_equal_lengths():
    from draftheads.train.loop import EvalShard

    rows = [{"input_ids": [5, 6, 7 + i], "loss_mask": [0, 1, 1]} for i in range(10)]
    shards = [EvalShard(rows, rank, 4) for rank in range(4)]  # 10 rows over 4 processes: 3, 3, 2, 2
    assert {len(s) for s in shards} == {3}
    seen = [s[i]["input_ids"][-1] for s in shards for i in range(len(s)) if any(s[i]["loss_mask"])]
    assert sorted(seen) == [7 + i for i in range(10)]
    padding = [s[i] for s in shards for i in range(len(s)) if not any(s[i]["loss_mask"])]
    assert len(padding) == 2


# ---------------------------------------------------------------------------------------------
# The train entry and its output folder
# ---------------------------------------------------------------------------------------------


def test_draftheads_train_prints_config_errors_without_a_traceback(tmp_path, capsys):
    from draftheads.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  max_stepz: 3\n")
    assert main(["train", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "max_stepz" in err and "Traceback" not in err
    assert main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_output_dir_that_is_a_file_is_refused_before_training(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2)
    Path(cfg.train.output_dir).write_text("not a folder")
    with pytest.raises(RunFolderError, match="is a file, not a folder"):
        run(cfg)


def test_read_only_output_folder_is_refused_before_training(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    import tempfile

    from draftheads.train import run_dir
    from draftheads.train.loop import run

    locked = tmp_path / "locked"
    locked.mkdir()
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, output_dir=str(locked / "run"))
    real_mkstemp = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):  # what a read-only mount does (root ignores chmod)
        if dir is not None and Path(dir) == locked:
            raise OSError(30, "Read-only file system")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(run_dir.tempfile, "mkstemp", read_only)
    with pytest.raises(RunFolderError, match="is not writable"):
        run(cfg)
    assert list(locked.iterdir()) == []


def test_max_length_above_the_targets_context_warns(tmp_path, tiny_target_dir, tiny_text_jsonl, capsys):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "data.max_length=600", max_steps=1, eval_every=0)
    run(cfg)
    assert "data.max_length=600 is above the target's context (max_position_embeddings=512)" in capsys.readouterr().out
