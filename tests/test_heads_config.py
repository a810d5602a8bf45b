"""A heads folder's config.json is validated at load: the file, the key and the problem are named,
and a folder that is something else (a model, a training run) is recognised as such."""
from __future__ import annotations

import json
import re

import pytest
import torch

import draftheads as dh

from inference_utils import tiny_target


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama")


def with_config(heads, folder, edit):
    """Save ``heads`` to ``folder`` and replace its config.json by ``edit(config dict)``."""
    heads.save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(cfg)))
    return folder


def refused(folder, message: str, error=ValueError) -> None:
    with pytest.raises(error, match=re.escape(str(folder / "config.json")) + ".*" + message):
        dh.load_heads(folder)


def drop(key):
    return lambda c: {k: v for k, v in c.items() if k != key}


def drop_target_key(key):
    return lambda c: {**c, "target": {k: v for k, v in c["target"].items() if k != key}}


def drop_extra(key):
    return lambda c: {**c, "extra": {k: v for k, v in c["extra"].items() if k != key}}


MEDUSA_BAD = {
    "a JSON list": (lambda c: [c], "expected a JSON object of heads settings, got a JSON list"),
    "missing num_heads": (drop("num_heads"), r"missing key\(s\) num_heads"),
    "missing head_type": (drop("head_type"), "missing key head_type"),
    "string num_heads": (lambda c: {**c, "num_heads": "2"}, "key num_heads must be a JSON integer, got string '2'"),
    "float hidden_size": (lambda c: {**c, "hidden_size": 64.0}, "key hidden_size must be a JSON integer, got number 64.0"),
    "extra as a list": (lambda c: {**c, "extra": []}, "key extra must be a JSON object, got list"),
    "target missing vocab_size": (drop_target_key("vocab_size"), r"missing key\(s\) target.vocab_size"),
    "target as a string": (lambda c: {**c, "target": "llama"}, "key 'target' must be an object"),
    "format_version 0": (lambda c: {**c, "format_version": 0}, "has format_version 0: a draftheads heads config has an integer format_version 1..1"),
    "format_version as a string": (lambda c: {**c, "format_version": "1"}, "has format_version '1'"),
    "no format_version": (drop("format_version"), "has no format_version"),
    "newer format_version": (lambda c: {**c, "format_version": 99}, "upgrade draftheads"),
}


@pytest.mark.parametrize("case", list(MEDUSA_BAD))
def test_bad_config_json_names_file_key_and_problem(target, tmp_path, case):
    edit, message = MEDUSA_BAD[case]
    refused(with_config(dh.MedusaHeads.for_target(target, num_heads=2), tmp_path / "h", edit), message)


def eagle3(target):
    heads = dh.Eagle3Head.for_target(target, num_heads=1, draft_vocab_size=16)
    heads.set_draft_vocab(torch.arange(target.config.vocab_size))
    return heads


@pytest.mark.parametrize("key", ["feature_layers", "draft_vocab_size", "rms_norm_eps", "head_dim"])
def test_eagle3_config_missing_its_extra_keys_is_refused_by_name(target, tmp_path, key):
    refused(with_config(eagle3(target), tmp_path / "h", drop_extra(key)), rf"eagle3 heads need key\(s\) extra.{key}")


def test_eagle_config_missing_its_layer_geometry_is_refused_by_name(target, tmp_path):
    refused(with_config(dh.EagleHead.for_target(target), tmp_path / "h", drop_extra("rope_theta")),
            r"eagle heads need key\(s\) extra.rope_theta")


def test_a_model_folder_passed_as_heads_is_recognised(target, tmp_path):
    target.save_pretrained(tmp_path / "model")
    refused(tmp_path / "model", r"this is a model folder \(a llama model's config.json\), not a heads folder")


@pytest.mark.parametrize("config", [
    {"medusa_num_heads": 5, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"},  # FasterDecoding Medusa: a key
    {"model_type": "medusa", "architectures": ["MedusaModel"]},  # vLLM Medusa
    {"architectures": ["LlamaForCausalLMEagle3"]},  # SGLang EAGLE-3
    {"speculators_model_type": "peagle", "architectures": ["Eagle3Speculator"]},
    {"architectures": ["DFlashDraftModel"], "dflash_config": {}},
])
def test_a_public_draft_checkpoint_passed_as_heads_is_named_one_to_import(tmp_path, config):
    """The marks of each public layout (its method's `ImportLayout.config_names` / ``config_keys``)
    tell a user who passes such a checkpoint where a heads folder goes to import it."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config))
    refused(tmp_path / "ckpt", r"this is a draft checkpoint in an engine's layout .*not a draftheads heads folder: "
                               r"convert it into a heads folder with `draftheads import")


def test_a_run_folder_passed_as_heads_points_to_its_heads(target, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"target": {}, "heads": {}, "data": {}, "train": {}, "tracking": {}}))
    refused(run, "this is a training run folder .*holds no exported heads yet")
    dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(run / "heads")
    refused(run, re.escape(f"this is a training run folder: the heads are in {run / 'heads'}"))
    (run / "config.json").unlink()  # a run folder whose top config was removed: still recognised
    refused(run, re.escape(f"is missing: {run} is not a draftheads heads folder; this is a training run folder"),
            FileNotFoundError)
    assert dh.load_heads(run / "heads").config.num_heads == 2


def test_a_file_passed_as_heads_is_refused(target, tmp_path):
    folder = dh.MedusaHeads.for_target(target, num_heads=2).save_pretrained(tmp_path / "h")
    with pytest.raises(FileNotFoundError, match="is a file: pass the heads folder"):
        dh.load_heads(folder / "config.json")
