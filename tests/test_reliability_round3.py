"""Issue 41, round 3 of the outside try-out: each test names its item (itemNN) and failed before
its fix. Run folders (1, 6, 7, 12), export/import folders (2), config checks (3, 4, 8, 9), the
CLI's error lines (5, 13, 14), import round trips (17), messages (10, 11) and tracking paths (16)."""
from __future__ import annotations

import errno
import json
import re
import shutil
import socket
from pathlib import Path

import pytest

from draftheads.train.run_dir import RunFolderError
from test_train import _cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (what must survive a refused command)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _no_loading(monkeypatch) -> None:
    """Fail the test if a run gets as far as loading its target (a refusal must come first)."""
    from draftheads.train import trainer

    def refuse(*args, **kwargs):
        raise AssertionError("the run loaded its target before refusing")

    monkeypatch.setattr(trainer, "load_target", refuse)


# ---------------------------------------------------------------------------------------------
# Item 1: --overwrite removes only a run's files, and refuses a folder that is not a run
# ---------------------------------------------------------------------------------------------


def test_item01_overwrite_refuses_a_model_folder(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    from draftheads.train.loop import run

    model = Path(shutil.copytree(tiny_target_dir, tmp_path / "model"))
    before = _listing(model)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, output_dir=str(model))
    _no_loading(monkeypatch)
    with pytest.raises(RunFolderError) as err:
        run(cfg, overwrite=True)
    message = str(err.value)
    assert "a llama model" in message and "config.json" in message and "--overwrite" in message
    assert _listing(model) == before  # the model still loads: nothing removed, nothing added
    with pytest.raises(RunFolderError, match="a llama model"):  # without --overwrite: named the same way
        run(cfg)
    assert _listing(model) == before


def test_item01_overwrite_refuses_a_heads_folder(tmp_path, tiny_target_dir, tiny_text_jsonl, tiny_llama, monkeypatch):
    from draftheads import MedusaHeads
    from draftheads.train.loop import run

    heads = tmp_path / "heads"
    MedusaHeads.for_target(tiny_llama, num_heads=2).save_pretrained(heads)
    before = _listing(heads)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, output_dir=str(heads))
    _no_loading(monkeypatch)
    with pytest.raises(RunFolderError, match=r"medusa heads folder \(config.json, model.safetensors\)"):
        run(cfg, overwrite=True)
    assert _listing(heads) == before


@pytest.mark.parametrize("what", ["config.json", "checkpoints", "heads", "metrics.json"])
def test_item01_overwrite_refuses_run_names_that_hold_something_else(tmp_path, tiny_target_dir, tiny_text_jsonl, what,
                                                                      monkeypatch):
    """A folder whose `heads/` or `checkpoints/` (or config.json, metrics.json) a run did not write."""
    from draftheads.train.loop import run

    out = tmp_path / "mine"
    out.mkdir()
    if what.endswith(".json"):
        (out / what).write_text(json.dumps({"my": "settings"}))
    else:
        (out / what).mkdir()
        (out / what / "notes.txt").write_text("mine")
    before = _listing(out)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, output_dir=str(out))
    _no_loading(monkeypatch)
    with pytest.raises(RunFolderError, match="not a draftheads run") as err:
        run(cfg, overwrite=True)
    assert what in str(err.value)
    assert _listing(out) == before


def test_item01_overwrite_still_replaces_a_run(tmp_path, tiny_target_dir, tiny_text_jsonl):
    """What --overwrite is for keeps working, also for a run that recorded no step (config only)."""
    from draftheads.train.loop import run

    first = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=1, eval_every=0)
    run(first)
    second = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, save_every=1, eval_every=0, seed=3)
    assert run(second, overwrite=True).step == 1
    out = Path(second.train.output_dir)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1"]
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 3


# ---------------------------------------------------------------------------------------------
# Item 6: a run that fails before its first step saved leaves its folder free
# ---------------------------------------------------------------------------------------------


def test_item06_a_run_that_fails_on_its_data_does_not_block_its_folder(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"text": "def f(x): return x"}) + "\n" + json.dumps({"text": 5}) + "\n")
    cfg = _cfg(tmp_path, tiny_target_dir, bad, max_steps=1, eval_every=0)
    with pytest.raises(ValueError, match="must be a string"):
        run(cfg)
    out = Path(cfg.train.output_dir)
    assert not (out / "config.json").exists()  # checked before anything was written
    fixed = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0)
    assert run(fixed).step == 1  # no --overwrite, no --resume needed


def test_item06_feature_layers_out_of_range_do_not_block_the_folder(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    common = dict(max_steps=1, eval_every=0)
    bad = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "heads.head_type=eagle3", "heads.num_heads=1",
               "heads.feature_layers=[0,1,9]", "heads.draft_vocab_size=64", "heads.lm_head=auto", **common)
    with pytest.raises(ValueError, match="feature"):
        run(bad)
    assert not (Path(bad.train.output_dir) / "config.json").exists()
    good = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "heads.head_type=eagle3", "heads.num_heads=1",
                "heads.feature_layers=[0,1]", "heads.draft_vocab_size=64", "heads.lm_head=auto", **common)
    assert run(good).step == 1


def test_item06_a_run_that_fails_in_training_before_any_save_leaves_no_config(tmp_path, tiny_target_dir,
                                                                            tiny_text_jsonl, monkeypatch):
    from draftheads.train import trainer
    from draftheads.train.loop import run

    def broken(self, group):
        raise RuntimeError("CUDA out of memory (simulated)")

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, eval_every=0, save_every=1)
    with monkeypatch.context() as m:
        m.setattr(trainer.Trainer, "train_step", broken)
        with pytest.raises(RuntimeError, match="simulated"):
            run(cfg)
    out = Path(cfg.train.output_dir)
    assert not (out / "config.json").exists() and not (out / "checkpoints").exists()
    smaller = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, eval_every=0, save_every=1, batch_size=2)
    assert run(smaller).step == 2


def test_item06_packing_with_group_by_length_is_refused_by_the_config(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.config import ConfigError

    with pytest.raises(ConfigError, match="data.packing and train.group_by_length"):
        _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, "data.packing=true", group_by_length=True)


def test_item06_a_killed_run_that_never_saved_a_step_is_taken_over(tmp_path, tiny_target_dir, tiny_text_jsonl, capsys):
    """Killed while loading (its config.json and its lock file stay): the next run, with any
    config, takes the folder over; the killed run was on this host and no longer holds its lock."""
    from draftheads.train.loop import run
    from draftheads.train.run_lock import LOCK_NAME

    killed = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=5)
    out = Path(killed.train.output_dir)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(killed.to_dict()))
    (out / LOCK_NAME).write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname(), "started": "x"}))
    rerun = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=6)
    assert run(rerun).step == 1
    assert "never saved a step" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["train"]["seed"] == 6


def test_item06_a_run_that_took_a_folder_over_and_failed_leaves_it_free(tmp_path, tiny_target_dir, tiny_text_jsonl,
                                                                        monkeypatch):
    from draftheads.train import trainer
    from draftheads.train.loop import run
    from draftheads.train.run_lock import LOCK_NAME

    killed = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=5)
    out = Path(killed.train.output_dir)
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(killed.to_dict()))
    (out / LOCK_NAME).write_text(json.dumps({"pid": 2**22 + 7, "host": socket.gethostname(), "started": "x"}))

    def broken(self, group):
        raise RuntimeError("out of memory (simulated)")

    with monkeypatch.context() as m:
        m.setattr(trainer.Trainer, "train_step", broken)
        with pytest.raises(RuntimeError, match="simulated"):
            run(_cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=6))
    assert not (out / "config.json").exists()
    assert run(_cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=7)).step == 1


def test_item06_resume_without_a_checkpoint_does_not_ask_for_resume(tmp_path, tiny_target_dir, tiny_text_jsonl):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=1)
    out = Path(cfg.train.output_dir)
    out.mkdir(parents=True)
    other = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=1, eval_every=0, seed=0)
    (out / "config.json").write_text(json.dumps(other.to_dict()))
    cfg.train.resume = "auto"
    with pytest.raises(RunFolderError, match="no checkpoint to resume from") as err:
        run(cfg)
    assert "pass --resume" not in str(err.value) and "--overwrite" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Item 7: a full disk during a checkpoint, and a resume on a full disk
# ---------------------------------------------------------------------------------------------


def test_item07_torch_unexpected_pos_reads_as_disk_full(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch):
    """torch's zip writer reports ENOSPC as ``RuntimeError ... unexpected pos``, not an OSError."""
    import accelerate.checkpointing as ac

    from draftheads.train.checkpoint import CheckpointError
    from draftheads.train.loop import run

    real_save = ac.save

    def save(obj, f, *args, **kwargs):
        if "step-4" in str(f):
            Path(f).write_bytes(b"partial")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4480 vs 4368")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(ac, "save", save)
    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=0)
    with pytest.raises(CheckpointError) as err:
        run(cfg)
    message = str(err.value)
    assert "disk" in message and "full" in message and "free" in message and "needs about" in message
    assert "step-4" in message and "intact" in message
    root = Path(cfg.train.output_dir) / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-2"]  # no .tmp, no half step-4


def test_item07_resume_on_a_full_disk_is_one_error_line(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch, capsys):
    import yaml

    from draftheads.cli import main
    from draftheads.train import run_lock
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=2, eval_every=0)
    run(cfg)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_lock.os, "pwrite", full)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({**cfg.to_dict(), "train": {**cfg.to_dict()["train"], "max_steps": 4}}))
    _no_loading(monkeypatch)
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    assert "full" in err and str(Path(cfg.train.output_dir)) in err


# ---------------------------------------------------------------------------------------------
# Item 12: --resume with train.max_steps below the checkpoint's step
# ---------------------------------------------------------------------------------------------


def test_item12_resume_past_max_steps_says_so(tmp_path, tiny_target_dir, tiny_text_jsonl, monkeypatch, capsys):
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=4, save_every=2, eval_every=0)
    run(cfg)
    out = Path(cfg.train.output_dir)
    heads_before = _listing(out / "heads")
    capsys.readouterr()
    shorter = _cfg(tmp_path, tiny_target_dir, tiny_text_jsonl, max_steps=2, save_every=2, eval_every=0, resume="auto")
    _no_loading(monkeypatch)
    with pytest.raises(RunFolderError, match="already past") as err:
        run(shorter)
    assert "step 4" in str(err.value) and "train.max_steps=2" in str(err.value)
    assert "training 2 steps" not in capsys.readouterr().out
    assert _listing(out / "heads") == heads_before  # not re-exported


# ---------------------------------------------------------------------------------------------
# Item 2: export/import --overwrite replace only what an export/import wrote, never the source
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def medusa_heads_dir(tmp_path, tiny_llama):
    from draftheads import MedusaHeads

    path = tmp_path / "heads"
    MedusaHeads.for_target(tiny_llama, num_heads=2, lm_head="own").save_pretrained(path)
    return path


@pytest.mark.parametrize("where", ["itself", "inside", "around"])
def test_item02_export_refuses_out_that_is_or_holds_the_heads(tmp_path, medusa_heads_dir, where, capsys):
    from draftheads.cli import main

    out = {"itself": medusa_heads_dir, "inside": medusa_heads_dir / "vllm", "around": tmp_path}[where]
    before = _listing(medusa_heads_dir)
    assert main(["export", str(medusa_heads_dir), str(out), "--format", "vllm", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "source" in err and str(medusa_heads_dir) in err
    assert _listing(medusa_heads_dir) == before


def test_item02_export_overwrites_only_an_earlier_export(tmp_path, medusa_heads_dir, capsys):
    from draftheads.cli import main

    out = tmp_path / "engine"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    before = _listing(out)
    assert main(["export", str(medusa_heads_dir), str(out), "--format", "vllm", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "notes.txt" in err and "sub/" in err and "draftheads_export.json" in err
    assert _listing(out) == before and (out / "sub").is_dir()
    fresh = tmp_path / "engine2"
    assert main(["export", str(medusa_heads_dir), str(fresh), "--format", "vllm"]) == 0
    assert main(["export", str(medusa_heads_dir), str(fresh), "--format", "sglang", "--overwrite"]) == 2  # medusa: no sglang
    assert main(["export", str(medusa_heads_dir), str(fresh), "--format", "vllm", "--overwrite"]) == 0


def test_item02_import_overwrites_only_an_earlier_import(tmp_path, medusa_heads_dir, tiny_target_dir, capsys):
    from draftheads.cli import main

    engine = tmp_path / "engine"
    assert main(["export", str(medusa_heads_dir), str(engine), "--format", "vllm"]) == 0
    args = ["--target", str(tiny_target_dir), "--dtype", "float32", "--overwrite"]
    engine_before = _listing(engine)
    for out in (engine, engine / "back"):  # the source itself, or inside it
        assert main(["import", str(engine), str(out), *args]) == 2
        assert "source" in capsys.readouterr().err
    assert _listing(engine) == engine_before
    # a heads folder someone else wrote (no import marker): named, kept
    assert main(["import", str(engine), str(medusa_heads_dir), *args]) == 2
    assert "config.json" in capsys.readouterr().err
    back = tmp_path / "back"
    assert main(["import", str(engine), str(back), *args[:-1]]) == 0
    assert main(["import", str(engine), str(back), *args]) == 0  # an earlier import: replaced


# ---------------------------------------------------------------------------------------------
# Item 17: an export -> import round trip keeps the heads' token counts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_item17_import_round_trip_keeps_token_counts(tmp_path, tiny_target_dir, fmt):
    import torch
    from transformers import AutoModelForCausalLM

    import draftheads as dh
    from draftheads.export import export_heads
    from draftheads.export.importers import import_heads

    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir).eval()
    if fmt == "vllm":
        heads = dh.MedusaHeads.for_target(target, num_heads=2, lm_head="own")
    else:
        heads = dh.Eagle3Head.for_target(target, num_layers=1, feature_layers=[0, 1], draft_vocab_size=64)
        counts = torch.arange(heads.config.vocab_size)
        heads.set_draft_vocab(counts)
    with torch.no_grad():
        heads.token_counts.copy_(torch.randint(0, 1000, heads.token_counts.shape))
    heads.save_pretrained(tmp_path / "heads")
    exported = export_heads(tmp_path / "heads", tmp_path / "engine", fmt, verifier=str(tiny_target_dir))
    back = dh.load_heads(import_heads(exported, tmp_path / "back", target), target=target)
    assert torch.equal(back.token_counts, heads.token_counts)


# ---------------------------------------------------------------------------------------------
# Item 3: DFlash blocks that do not fit the rows; a run with nothing to learn from
# ---------------------------------------------------------------------------------------------


def test_item03_dflash_block_longer_than_the_rows_is_refused_by_the_config():
    from draftheads.config import ConfigError, config_from_dict

    base = {"data": {"path": "rows.jsonl", "max_length": 256}, "heads": {"head_type": "dflash", "block_size": 512}}
    with pytest.raises(ConfigError, match=r"heads.block_size=512 .*\(data.max_length=256\)"):
        config_from_dict(base)
    with pytest.raises(ConfigError, match=r"heads.num_heads=300 .*block of 301.*\(data.max_length=256\)"):
        config_from_dict({**base, "heads": {"head_type": "dflash", "num_heads": 300}})
    assert config_from_dict({**base, "heads": {"head_type": "dflash", "block_size": 256}}).heads.block_size == 256


def test_item03_a_run_without_one_supervised_position_is_refused(tmp_path, tiny_target_dir):
    """Every row shorter than a block: every step's loss was 0.000, eval NaN, heads exported, exit 0."""
    from test_train import HEAD_TYPE_OVERRIDES

    from draftheads.train.loop import run

    short = tmp_path / "short.jsonl"
    from conftest import _WORDS

    short.write_text("".join(json.dumps({"text": f"def {w}"}) + "\n" for w in _WORDS if w.isalpha()))
    dflash = [o for o in HEAD_TYPE_OVERRIDES["dflash"] if not o.startswith("heads.block_size")]
    cfg = _cfg(tmp_path, tiny_target_dir, short, *dflash, "heads.block_size=16", max_steps=2, eval_every=0)
    with pytest.raises(ValueError, match="no position to train on") as err:
        run(cfg)
    assert "heads.block_size" in str(err.value)
    assert not (Path(cfg.train.output_dir) / "heads").exists() and not (Path(cfg.train.output_dir) / "config.json").exists()


# ---------------------------------------------------------------------------------------------
# Item 4: the parallel drafters' mask token against every token of the rendered rows
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def chat_target_dir(tmp_path, tiny_target_dir):
    """The tiny target with a chat template whose headers hold <unk> (id 0), as ChatML's hold
    <|im_start|>: in every row, but never a trained (assistant content) token."""
    from transformers import AutoTokenizer

    path = Path(shutil.copytree(tiny_target_dir, tmp_path / "chat-target"))
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = ("{% for m in messages %}<unk>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
                         "{% if add_generation_prompt %}<unk>assistant {% endif %}")
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("head_type", ["peagle", "dflash"])
def test_item04_mask_token_in_template_headers_is_refused(tmp_path, chat_target_dir, head_type):
    from test_train import HEAD_TYPE_OVERRIDES

    from draftheads.train.loop import run

    data = tmp_path / "chat.jsonl"
    from conftest import _WORDS

    words = [w for w in _WORDS if w.isalpha()]  # the tiny tokenizer knows them: no <unk> in the content
    rows = [{"messages": [{"role": "user", "content": f"def {words[i % len(words)]}(self):"},
                          {"role": "assistant", "content": f"return self.{words[(3 * i) % len(words)]} + x"}]}
            for i in range(40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    options = [o for o in HEAD_TYPE_OVERRIDES[head_type] if "mask_token_id" not in o]
    cfg = _cfg(tmp_path, chat_target_dir, data, *options, "heads.mask_token_id=0", "data.format=messages",
               max_steps=1, eval_every=0)
    with pytest.raises(ValueError, match=r"mask_token_id 0 .*occurs .* in the rendered training rows") as err:
        run(cfg)
    assert "<unk>" in str(err.value)
    assert not (Path(cfg.train.output_dir) / "config.json").exists()


# ---------------------------------------------------------------------------------------------
# Items 8 and 9: config values that cannot be what the user meant
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e999"])
def test_item08_non_finite_learning_rate_is_refused(value):
    from draftheads.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=r"train.lr"):
        config_from_dict({}, [f"train.lr={value}"])


def test_item08_non_finite_floats_are_refused_everywhere():
    from draftheads.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=r"train.max_grad_norm must be a finite number, got inf"):
        config_from_dict({}, ["train.max_grad_norm=.inf"])


@pytest.mark.parametrize("head_type", ["eagle", "eagle3", "peagle", "dflash"])
def test_item09_train_labels_for_eagle_family_heads_is_refused(head_type):
    from draftheads.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=rf"train.labels is set \('target'\) but {head_type} heads do not use it"):
        config_from_dict({"heads": {"head_type": head_type}}, ["train.labels=target"])
    assert config_from_dict({"heads": {"head_type": "medusa"}}, ["train.labels=target"]).train.labels == "target"


# ---------------------------------------------------------------------------------------------
# Item 5: bad input to generate / bench is one error line and exit 2, never a traceback
# ---------------------------------------------------------------------------------------------


def _one_error_line(err: str) -> str:
    """The command's error line: exactly one, the last thing printed, and no traceback."""
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert "Traceback" not in err and len(errors) == 1, err[-2000:]
    assert err.rstrip().splitlines()[-1] == errors[0], err[-2000:]
    return errors[0]


def _damaged_heads(kind: str, heads: Path, tmp_path: Path) -> Path:
    """A copy of the heads folder ``heads`` damaged as ``kind`` says (or another target's heads)."""
    import torch
    from safetensors.torch import load_file, save_file

    import draftheads as dh
    from conftest import make_tiny_model
    from inference_utils import tiny_target

    out = tmp_path / kind
    if kind == "missing":
        return out
    if kind == "other-target-same-shapes":
        dh.MedusaHeads.for_target(make_tiny_model("llama", seed=7), num_heads=2).save_pretrained(out)
        return out
    if kind == "other-target-other-shapes":
        dh.MedusaHeads.for_target(tiny_target("llama", hidden=32), num_heads=2).save_pretrained(out)
        return out
    shutil.copytree(heads, out)
    weights, config = out / "model.safetensors", out / "config.json"
    if kind == "truncated-weights":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    elif kind == "corrupt-weights":
        weights.write_bytes(b"not a safetensors file" * 8)
    elif kind in ("wrong-head-type", "unknown-head-type"):
        data = json.loads(config.read_text())
        data["head_type"] = "eagle" if kind == "wrong-head-type" else "medusa2"
        config.write_text(json.dumps(data))
    elif kind == "nan-weights":
        state = load_file(str(weights))
        name = next(k for k, v in state.items() if v.is_floating_point())
        state[name].view(-1)[0] = float("nan")
        save_file(state, str(weights), metadata={"format": "pt"})
    elif kind == "no-config":
        config.unlink()
    elif kind == "garbage-tree":
        (out / "tree.json").write_text("{not json")
    else:
        raise AssertionError(kind)
    del torch
    return out


HEADS_DAMAGE = ["truncated-weights", "corrupt-weights", "wrong-head-type", "unknown-head-type", "nan-weights",
                "no-config", "garbage-tree", "other-target-same-shapes", "other-target-other-shapes", "missing"]


@pytest.mark.parametrize("kind", HEADS_DAMAGE)
def test_item05_generate_with_unusable_heads_is_one_error_line(tmp_path, tiny_target_dir, medusa_heads_dir, kind, capsys):
    from draftheads.cli import main

    heads = _damaged_heads(kind, medusa_heads_dir, tmp_path)
    capsys.readouterr()
    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(heads), "--prompt", "def f",
                 "--max-new-tokens", "3", "--no-chat-template", "--quiet"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and str(heads) in line


@pytest.mark.parametrize("kind", ["other-target-same-shapes", "nan-weights"])
def test_item05_bench_with_unusable_heads_is_one_error_line(tmp_path, tiny_target_dir, medusa_heads_dir, kind, capsys):
    from draftheads.cli import main

    heads = _damaged_heads(kind, medusa_heads_dir, tmp_path)
    capsys.readouterr()
    code = main(["bench", "--target", str(tiny_target_dir), "--heads", str(heads), "--out", str(tmp_path / "bench"),
                 "--max-new-tokens", "3", "--max-questions", "1", "--no-chat-template", "--no-progress"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and str(heads) in line
    assert not (tmp_path / "bench").exists()


def test_item05_an_empty_raw_prompt_is_one_error_line(tiny_target_dir, medusa_heads_dir, capsys):
    from draftheads.cli import main

    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(medusa_heads_dir), "--prompt", "",
                 "--no-chat-template"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and "--prompt" in line and "empty" in line


def test_item05_a_prompt_longer_than_the_models_positions_is_one_error_line(tiny_target_dir, medusa_heads_dir, capsys):
    from draftheads.cli import main

    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(medusa_heads_dir),
                 "--prompt", "def f " * 400, "--no-chat-template", "--max-new-tokens", "4"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and "512" in line and "--max-new-tokens" in line


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a torch without CUDA")
def test_item05_device_cuda_on_a_cpu_torch_is_one_error_line(tiny_target_dir, medusa_heads_dir, capsys):
    from draftheads.cli import main

    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(medusa_heads_dir), "--prompt", "x",
                 "--no-chat-template", "--device", "cuda"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and "--device cuda" in line and "--device cpu" in line


def test_item05_an_unknown_device_is_one_error_line(tiny_target_dir, medusa_heads_dir, capsys):
    from draftheads.cli import main

    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(medusa_heads_dir), "--prompt", "x",
                 "--no-chat-template", "--device", "gpu0"])
    assert code == 2 and "--device 'gpu0'" in _one_error_line(capsys.readouterr().err)


# ---------------------------------------------------------------------------------------------
# Item 13: an engine export passed as heads points to `draftheads import`
# ---------------------------------------------------------------------------------------------


def test_item13_generate_with_an_engine_export_points_to_import(tmp_path, tiny_target_dir, medusa_heads_dir, capsys):
    from draftheads.cli import main

    engine = tmp_path / "engine"
    assert main(["export", str(medusa_heads_dir), str(engine), "--format", "vllm"]) == 0
    capsys.readouterr()
    code = main(["generate", "--target", str(tiny_target_dir), "--heads", str(engine), "--prompt", "x",
                 "--no-chat-template"])
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and f"draftheads import {engine}" in line and str(medusa_heads_dir) in line
    assert "pass the model as the target" not in line


# ---------------------------------------------------------------------------------------------
# Item 14: importing an export whose config names another verifier than --target
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def other_target_dir(tmp_path, tiny_tokenizer):
    """A second tiny Llama of the very same shapes as tiny_target_dir (other weights)."""
    from conftest import make_tiny_model

    path = tmp_path / "other-target"
    make_tiny_model("llama", seed=11).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def test_item14_import_refuses_an_export_for_another_verifier(tmp_path, tiny_target_dir, other_target_dir, capsys):
    import torch
    from transformers import AutoModelForCausalLM

    import draftheads as dh
    from draftheads.cli import main

    target = AutoModelForCausalLM.from_pretrained(tiny_target_dir)
    heads = dh.Eagle3Head.for_target(target, num_layers=1, feature_layers=[0, 1], draft_vocab_size=64)
    heads.set_draft_vocab(torch.arange(heads.config.vocab_size))
    heads.save_pretrained(tmp_path / "heads")
    engine = tmp_path / "engine"
    assert main(["export", str(tmp_path / "heads"), str(engine), "--format", "speculators",
                 "--verifier", str(tiny_target_dir)]) == 0
    capsys.readouterr()
    args = ["import", str(engine), str(tmp_path / "back"), "--target", str(other_target_dir), "--dtype", "float32"]
    code = main(args)
    line = _one_error_line(capsys.readouterr().err)
    assert code == 2 and str(tiny_target_dir) in line and str(other_target_dir) in line
    assert "--allow-other-verifier" in line and not (tmp_path / "back").exists()
    assert main(args + ["--allow-other-verifier"]) == 0  # the named override
    copy = Path(shutil.copytree(tiny_target_dir, tmp_path / "copy-of-target"))  # the same model elsewhere: fine
    assert main(["import", str(engine), str(tmp_path / "back2"), "--target", str(copy), "--dtype", "float32"]) == 0


# ---------------------------------------------------------------------------------------------
# Item 10: data errors say the file's line number (1-based), the same way everywhere
# ---------------------------------------------------------------------------------------------


def _build(path: Path, tokenizer, tmp_path: Path, **data):
    from draftheads.data import build_datasets
    from draftheads.data.config import DataConfig

    cfg = DataConfig(path=str(path), max_length=48, eval_fraction=0.0, cache_dir=str(tmp_path / "hf-cache"), **data)
    return build_datasets(cfg, tokenizer)


def test_item10_a_bad_text_row_is_named_by_its_line(tmp_path, tiny_tokenizer):
    good = json.dumps({"text": "def f(self): return self.value"})
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join([good] * 29 + [json.dumps({"text": 5})]) + "\n")  # line 30 (was "row 29")
    with pytest.raises(ValueError) as err:
        _build(path, tiny_tokenizer, tmp_path)
    message = str(err.value)
    assert f"{path} line 30:" in message and not re.search(r"\brow \d", message)


def test_item10_a_bad_chat_row_in_a_folder_is_named_by_its_file_and_line(tmp_path):
    from conftest import make_tiny_tokenizer

    tok = make_tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    folder = tmp_path / "chats"
    folder.mkdir()
    row = {"messages": [{"role": "user", "content": "def f"}, {"role": "assistant", "content": "return self"}]}
    (folder / "a.jsonl").write_text((json.dumps(row) + "\n") * 4)
    bad = {"messages": [{"role": "robot", "content": "x"}]}
    (folder / "b.jsonl").write_text(json.dumps(row) + "\n\n" + json.dumps(bad) + "\n")  # b.jsonl line 3, row 5
    with pytest.raises(ValueError) as err:
        _build(folder, tok, tmp_path, format="messages")
    assert f"{folder / 'b.jsonl'} line 3, message 1:" in str(err.value) and not re.search(r"\brow \d", str(err.value))


def test_item10_invalid_json_says_the_line_only(tmp_path, tiny_tokenizer):
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join([json.dumps({"text": "def f"})] * 21 + ["{not json"]) + "\n")
    with pytest.raises(ValueError) as err:
        _build(path, tiny_tokenizer, tmp_path)
    assert f"{path}: line 22 is not valid JSON" in str(err.value) and not re.search(r"\brow \d", str(err.value))


# ---------------------------------------------------------------------------------------------
# Item 11: a data folder whose files have different columns names both
# ---------------------------------------------------------------------------------------------


def test_item11_a_folder_of_files_with_different_columns_names_them(tmp_path, tiny_tokenizer):
    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "a.jsonl").write_text((json.dumps({"text": "def f"}) + "\n") * 5)
    (folder / "b.jsonl").write_text((json.dumps({"messages": [], "id": 1}) + "\n") * 5)
    with pytest.raises(ValueError) as err:
        _build(folder, tiny_tokenizer, tmp_path)
    message = str(err.value)
    assert "a.jsonl" in message and "b.jsonl" in message and "'text'" in message and "'messages'" in message
    assert "'id'" in message and "corrupt" not in message


# ---------------------------------------------------------------------------------------------
# Item 16: a tracking run name is a folder name inside train.output_dir, never a path out of it
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key,value", [("run_name", "../../x"), ("run_name", "/tmp/elsewhere"), ("project", ".."),
                                       ("run_name", "a/../../b")])
def test_item16_a_tensorboard_run_name_cannot_leave_the_output_dir(key, value):
    from draftheads.config import ConfigError, config_from_dict

    with pytest.raises(ConfigError, match=rf"tracking.{key}"):
        config_from_dict({"tracking": {"report_to": "tensorboard", key: value}})
    config_from_dict({"tracking": {"report_to": "tensorboard", "run_name": "medusa-run.2"}})  # a plain name is fine
    config_from_dict({"tracking": {"report_to": "wandb", "run_name": "team/exp 1"}})  # a W&B display name is no path


def test_item16_tensorboard_logs_stay_inside_the_output_dir(tmp_path, tiny_target_dir, tiny_text_jsonl):
    pytest.importorskip("tensorboard")
    from draftheads.train.loop import run

    cfg = _cfg(tmp_path / "a" / "b", tiny_target_dir, tiny_text_jsonl, "tracking.report_to=tensorboard",
               "tracking.run_name=tb", max_steps=1, eval_every=0)
    run(cfg)
    out = Path(cfg.train.output_dir)
    assert (out / "tb").is_dir()
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["hf-cache", "run"]
