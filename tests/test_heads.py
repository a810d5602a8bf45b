"""Medusa heads: shapes, the zero-init identity, and the heads folder (save, strict load, errors)."""
from __future__ import annotations

import json

import pytest
import torch

import draftheads as dh
from draftheads.heads.io import WEIGHTS_NAME

from inference_utils import tiny_target


@pytest.fixture
def target():
    return tiny_target("llama")


def test_shapes_and_separate_blocks(target):
    heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=2)
    assert heads(torch.randn(5, 64)).shape == (5, 3, 64)  # [positions, heads, vocab]
    blocks = [block for head in heads.blocks for block in head]
    assert len({id(b.linear.weight) for b in blocks}) == 6  # no `[block] * n` weight sharing


@pytest.mark.parametrize("lm_head", ["own", "shared"])
def test_fresh_heads_predict_what_the_target_lm_head_predicts(target, lm_head):
    heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=2, lm_head=lm_head)
    hidden = torch.randn(7, 64)
    expected = target.get_output_embeddings()(hidden)
    for k in range(3):
        torch.testing.assert_close(heads(hidden)[:, k], expected, rtol=0, atol=0)


def test_save_load_round_trip_is_bit_exact(target, tmp_path):
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p))
    heads.save_pretrained(tmp_path / "h")
    loaded = dh.load_heads(tmp_path / "h", target=target)
    assert heads.state_dict().keys() == loaded.state_dict().keys()
    for key, value in heads.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["format_version"] == 1 and config["target"]["hidden_size"] == 64


def test_bad_heads_folders_are_refused_by_name(target, tmp_path):
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    good = heads.save_pretrained(tmp_path / "good")
    with pytest.raises(FileNotFoundError, match="heads folder not found"):
        dh.load_heads(tmp_path / "nowhere")

    def copy(name):
        import shutil

        return shutil.copytree(good, tmp_path / name)

    truncated = copy("truncated")
    data = (truncated / WEIGHTS_NAME).read_bytes()
    (truncated / WEIGHTS_NAME).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        dh.load_heads(truncated)

    pickled = copy("pickled")
    (pickled / WEIGHTS_NAME).unlink()
    torch.save(heads.state_dict(), pickled / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="only safetensors weights are read"):
        dh.load_heads(pickled)

    unknown = copy("unknown")
    cfg = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**cfg, "head_type": "eagle9"}))
    with pytest.raises(ValueError, match="unknown head_type 'eagle9'; valid: dflash, dflash2, dspark, eagle, eagle3, hydra, medusa, mtp, peagle"):
        dh.load_heads(unknown)

    resized = copy("resized")
    (resized / "config.json").write_text(json.dumps({**cfg, "num_heads": 3}))
    with pytest.raises(ValueError, match="does not match its config.json .*missing"):
        dh.load_heads(resized)

    with pytest.raises(ValueError, match="vocab_size"):
        dh.load_heads(good, target=tiny_target("llama", vocab=80))


def test_failed_export_keeps_the_previous_good_one(target, tmp_path, monkeypatch):
    heads = dh.MedusaHeads.for_target(target, num_heads=2)
    path = heads.save_pretrained(tmp_path / "heads")
    before = (path / WEIGHTS_NAME).read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("draftheads.heads.folder.save_file", fail)
    with torch.no_grad():
        next(heads.parameters()).add_(1.0)
    with pytest.raises(OSError, match="disk full"):
        heads.save_pretrained(path)
    assert (path / WEIGHTS_NAME).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads"]  # no temp folders left behind
    dh.load_heads(path, target=target)


@pytest.mark.parametrize("edit", ["no fingerprint", "empty fingerprint", "no target"])
def test_heads_without_a_target_fingerprint_are_refused_on_another_target(tmp_path, edit):
    """Same architecture and sizes, another model: only the fingerprint tells them apart, so a
    config without one (edited, or written by another tool) must not load silently."""
    trained_on, other = tiny_target("llama", seed=0), tiny_target("llama", seed=1)
    folder = dh.MedusaHeads.for_target(trained_on, num_heads=2).save_pretrained(tmp_path / "h")
    with pytest.raises(ValueError, match="LM head weights differ"):  # unedited: refused there
        dh.load_heads(folder, target=other)
    cfg = json.loads((folder / "config.json").read_text())
    if edit == "no fingerprint":
        del cfg["target"]["lm_head_fingerprint"]
    elif edit == "empty fingerprint":
        cfg["target"]["lm_head_fingerprint"] = []
    else:
        del cfg["target"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lm_head_fingerprint|no 'target' object") as err:
        dh.load_heads(folder, target=other)
    assert "check_fingerprint=False" in str(err.value) and "config.json" in str(err.value)
    with pytest.raises(ValueError, match="check_fingerprint=False"):
        dh.load_heads(folder, target=trained_on)  # nothing proves it is the right one either
    # the named opt-out, and loading without a target (nothing to check against), still work
    assert dh.load_heads(folder, target=trained_on, check_fingerprint=False).config.num_heads == 2
    assert dh.load_heads(folder).config.num_heads == 2


def test_heads_with_non_finite_weights_are_refused_at_load_as_at_save(target, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(tmp_path / "h")
    state = load_file(str(folder / WEIGHTS_NAME))
    name = sorted(k for k, v in state.items() if v.is_floating_point())[0]
    for bad in (float("nan"), float("inf")):
        state[name].view(-1)[0] = bad
        save_file(state, str(folder / WEIGHTS_NAME))  # written by something other than save_pretrained
        with pytest.raises(ValueError, match=f"non-finite values.*{name}"):
            dh.load_heads(folder)
