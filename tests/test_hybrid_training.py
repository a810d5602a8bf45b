"""Heads train on hybrid targets (linear attention / state-space layers beside attention) like on any
other: from a config, their features read across mixed layer types, from the feature cache too; and
packing, which no mask can keep apart in a recurrent layer, is refused by name."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import draftheads as dh
from draftheads.config import config_from_dict
from draftheads.target import load_target
from draftheads.train.packing import PackingError

from hybrid_utils import reference, tiny_hybrid


@pytest.fixture(scope="module", params=["qwen3_5_text", "nemotron_h"])
def hybrid_dir(request, tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny hybrid + the tiny tokenizer as a model folder (pad id 3 as the tokenizer has it)."""
    path = tmp_path_factory.mktemp(request.param)
    tiny_hybrid(request.param, pad_token_id=3).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def _config(tmp_path: Path, target_dir: Path, data: Path, head_type: str, **train) -> dict:
    heads = {"head_type": head_type, "num_heads": 2, "num_layers": 1}
    if head_type == "eagle3":
        heads["draft_vocab_size"] = 128
    return {
        "target": {"name_or_path": str(target_dir), "dtype": "float32"},
        "heads": heads,
        "data": {"path": str(data), "format": "text", "max_length": 48, "eval_fraction": 0.1,
                 "cache_dir": str(tmp_path / "hf-cache")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 6, "batch_size": 4, "lr": 1e-2,
                  "warmup_steps": 1, "eval_every": 3, "eval_batches": 1, "save_every": 0, "log_every": 2,
                  "choose_tree": False, **train},
    }


def _run(data: dict, tmp_path: Path, name: str, *overrides: str):
    from draftheads.train.loop import run

    data = json.loads(json.dumps(data))
    data["train"]["output_dir"] = str(tmp_path / name)
    return run(config_from_dict(data, list(overrides)))


def test_eagle3_trains_on_a_hybrid_and_decodes_it_exactly(tmp_path, hybrid_dir, tiny_text_jsonl):
    """EAGLE-3's low / mid / high feature layers fall on linear-attention and attention layers alike; the
    trained heads decode the target exactly."""
    result = _run(_config(tmp_path, hybrid_dir, tiny_text_jsonl, "eagle3"), tmp_path, "eagle3")
    assert result.step == 6 and result.metrics["evals"] and result.metrics["final_eval"]
    target = load_target(str(hybrid_dir), dtype="float32")[0]
    target.generation_config.eos_token_id = None
    heads = dh.load_heads(result.heads_dir, target=target)
    assert heads.feature_layers  # states entering layers of both kinds (and the last one's output)
    ids = torch.tensor([[5, 17, 9, 33, 5, 17, 9]])
    decoder = dh.SpeculativeDecoder(target, heads, tree={"total_tokens": 6, "depth": 3, "top_k": 2},
                                    draft_budget=None, batch_plan=None)
    out = decoder.generate(ids, max_new_tokens=20, eos_token_id=[])
    assert out.sequences.tolist() == reference(target, ids, 20).tolist()


def test_training_from_the_feature_cache_equals_online_training_on_a_hybrid(tmp_path, hybrid_dir, tiny_text_jsonl):
    """Equal to float32 rounding, not bitwise as on attention-only targets (tests/test_features.py): the
    chunked linear-attention and SSD scans of transformers solve a whole chunk at once, so a row's
    features move in the last bits with the padding of the rows batched beside it (about 1e-6 between a
    row alone and in a batch), and the cache batches rows in another order than training."""
    from draftheads.cli import main

    data = _config(tmp_path, hybrid_dir, tiny_text_jsonl, "eagle3")
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    out = tmp_path / "features"
    assert main(["cache-features", "--config", str(cfg_path), "--out", str(out), "--no-progress",
                 "--dtype", "float32"]) == 0
    online = _run(data, tmp_path, "online")
    cached = _run(data, tmp_path, "cached", f"data.features={out}")
    for key, value in online.heads.state_dict().items():
        torch.testing.assert_close(cached.heads.state_dict()[key], value, rtol=1e-4, atol=1e-5)


def test_packing_on_a_hybrid_target_is_refused_by_name(tmp_path, hybrid_dir, tiny_text_jsonl):
    data = _config(tmp_path, hybrid_dir, tiny_text_jsonl, "medusa")
    with pytest.raises(PackingError, match=r"data.packing: the target \(\w+\) has layers that keep a recurrent state "
                                           r"\(linear_attention\)"):
        _run(data, tmp_path, "packed", "data.packing=true")
    assert not (tmp_path / "packed" / "heads").exists()
