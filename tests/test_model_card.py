"""Model cards: every heads folder training writes, and every export, carries a README.md that says
what the heads are, what training measured, and the exact engine config that serves them; `draftheads
push` uploads heads or exports with their card (huggingface_hub's upload is replaced: no network)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from draftheads.cli import main
from draftheads.config import config_from_dict
from draftheads.export import export_heads
from draftheads.export.card import MARKER

OVERRIDES = {
    "medusa": {"num_heads": 3, "num_layers": 1, "lm_head": "own"},
    "eagle3": {"head_type": "eagle3", "num_heads": 2, "num_layers": 1, "lm_head": "auto", "draft_vocab_size": 64,
               "feature_layers": [0, 1]},  # the tiny target has 2 layers: vLLM captures the streams entering them
}


def train_tiny(tmp_path: Path, target_dir: Path, data: Path, head_type: str) -> Path:
    """A 6-step run without the tree choice at its end (train.choose_tree: timed decoding, and no
    card figure comes from it)."""
    from draftheads.train import loop

    cfg = config_from_dict({
        "target": {"name_or_path": str(target_dir), "dtype": "float32"},
        "heads": OVERRIDES[head_type],
        "data": {"path": str(data), "format": "text", "max_length": 48, "eval_fraction": 0.1,
                 "cache_dir": str(tmp_path / "hf-cache")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 6, "batch_size": 4, "lr": 1e-2, "eval_every": 3,
                  "eval_batches": 2, "save_every": 0, "log_every": 3, "choose_tree": False},
    }, [])
    loop.run(cfg)
    return tmp_path / "run"


def speculative_configs(card: str) -> list[dict]:
    return [json.loads(m) for m in re.findall(r"--speculative-config '(\{.*?\})'", card)]


@pytest.fixture(scope="module", params=["medusa", "eagle3"])
def trained(request, tmp_path_factory, tiny_target_dir, tiny_text_jsonl):
    root = tmp_path_factory.mktemp(f"card-{request.param}")
    return request.param, train_tiny(root, tiny_target_dir, tiny_text_jsonl, request.param), tiny_target_dir


def test_training_writes_a_card_with_its_figures_and_serving_config(trained):
    head_type, run_dir, target_dir = trained
    card = (run_dir / "heads" / "README.md").read_text()
    metrics = json.loads((run_dir / "metrics.json").read_text())
    heads_cfg = json.loads((run_dir / "heads" / "config.json").read_text())
    assert card.startswith("---\nlibrary_name: draftheads") and MARKER in card
    assert f"draft heads for `{target_dir}`" in card and f"`{head_type}`" in card
    steps = heads_cfg["num_heads"]
    label = "heads (draft positions)" if head_type == "medusa" else "draft steps in training"
    assert f"| {label} | {steps} |" in card and f"| vocabulary | {heads_cfg['vocab_size']} |" in card
    # data and budget, as the run's config and metrics.json record them
    assert str(json.loads((run_dir / "config.json").read_text())["data"]["path"]) in card
    assert f"6 optimizer steps of 4 sequences x 1 accumulation x 1 process(es), {metrics['train_tokens']:,} training tokens" in card
    # the figures are training's evaluation, for every eval step, per head
    final = metrics["final_eval"]
    row = next(line for line in card.splitlines() if line.startswith("| 6 |"))
    assert row == ("| 6 | " + " | ".join(f"{final[f'eval/top1_head{k}']:.3f}" for k in range(steps))
                   + f" | {final['eval/acceptance_length']:.3f} | {final['eval/simulated_acceptance']:.3f} |")
    assert any(line.startswith("| 3 |") for line in card.splitlines())
    assert "No speedup is claimed" in card and "draftheads bench" in card
    # serving: export, then the exact speculative_config vLLM takes
    assert f"draftheads export {run_dir / 'heads'} heads-vllm --format vllm" in card
    assert speculative_configs(card) == [{"method": head_type, "model": "heads-vllm", "num_speculative_tokens": steps}]
    assert ("--speculative-algorithm EAGLE3" in card) == (head_type == "eagle3")  # SGLang serves EAGLE-3, not Medusa
    if (run_dir / "best" / "config.json").is_file():
        assert "step" in (run_dir / "best" / "README.md").read_text()


def test_an_export_card_names_its_folder_in_the_config_and_keeps_the_figures(trained, tmp_path):
    head_type, run_dir, target_dir = trained
    out = export_heads(run_dir / "heads", tmp_path / "export", "vllm", verifier=str(target_dir), num_speculative_tokens=2)
    card = (out / "README.md").read_text()
    assert speculative_configs(card) == [{"method": head_type, "model": str(out), "num_speculative_tokens": 2}]
    assert f"vllm serve {target_dir} --speculative-config" in card
    heads_card = (run_dir / "heads" / "README.md").read_text()
    measured = heads_card.split("<!-- draftheads:measured -->")[1].split("<!-- /draftheads:measured -->")[0]
    assert measured in card and "| 6 |" in measured  # training's figures travel with the export
    if head_type == "eagle3":
        assert f"vllm serve {out}\n" in card  # the speculators folder names its verifier


def test_an_export_of_heads_without_card_says_so(tmp_path, tiny_target_dir):
    import draftheads as dh
    from conftest import make_tiny_model

    dh.EagleHead.for_target(make_tiny_model("llama")).save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "sg", "sglang", verifier=str(tiny_target_dir))
    card = (out / "README.md").read_text()
    assert "No evaluation was recorded" in card
    assert f"--speculative-algorithm EAGLE \\\n    --speculative-draft-model-path {out} --speculative-num-steps 1" in card


# -- push ---------------------------------------------------------------------------------------------
@pytest.fixture
def fake_hub(monkeypatch):
    """huggingface_hub's HfApi with the network calls replaced: records what would be uploaded."""
    from huggingface_hub import HfApi

    calls = {}

    def upload_folder(self, *, repo_id, folder_path, repo_type=None, revision=None, commit_message=None, **kw):
        folder = Path(folder_path)
        calls["upload"] = {"repo_id": repo_id, "revision": revision, "files": sorted(p.name for p in folder.iterdir()),
                           "card": (folder / "README.md").read_text(),
                           "weights": (folder / "model.safetensors").read_bytes()}
        return "https://huggingface.co/fake/commit/1"

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: calls.setdefault("create", (repo_id, kw)))
    monkeypatch.setattr(HfApi, "create_branch", lambda self, repo_id, **kw: calls.setdefault("branch", kw["branch"]))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def test_push_uploads_heads_with_a_card_naming_the_repo(trained, fake_hub, capsys):
    head_type, run_dir, _ = trained
    heads = run_dir / "heads"
    assert main(["push", str(heads), "someone/tiny-heads", "--private", "--revision", "v1"]) == 0
    up = fake_hub["upload"]
    assert up["repo_id"] == "someone/tiny-heads" and up["revision"] == "v1" and fake_hub["branch"] == "v1"
    assert fake_hub["create"][1]["private"] is True
    (heads / "tree.json").write_text(json.dumps({"tree": [[0]]}))  # what calibrate would add: it travels too
    (heads / "confidence.json").write_text("{}")  # and, for EAGLE heads, the confidence table
    assert main(["push", str(heads), "someone/tiny-heads", "--private", "--revision", "v1"]) == 0
    up = fake_hub["upload"]
    assert up["files"] == ["README.md", "confidence.json", "config.json", "model.safetensors", "tree.json"]
    assert up["weights"] == (heads / "model.safetensors").read_bytes()
    # the Hub copy's card names the repo where the local one names the folder; the figures stay
    assert str(heads) not in up["card"] and "draftheads export someone/tiny-heads heads-vllm" in up["card"]
    measured = lambda card: card.split("<!-- draftheads:measured -->")[1].split("<!-- /draftheads:measured -->")[0]  # noqa: E731
    assert measured(up["card"]) == measured((heads / "README.md").read_text()) and "| 6 |" in measured(up["card"])


def test_push_writes_a_missing_card_and_uploads_an_export(tmp_path, fake_hub, tiny_target_dir):
    import draftheads as dh
    from conftest import make_tiny_model

    dh.MedusaHeads.for_target(make_tiny_model("llama"), num_heads=2, lm_head="own").save_pretrained(tmp_path / "heads")
    out = export_heads(tmp_path / "heads", tmp_path / "export", "vllm")
    (out / "README.md").unlink()
    (out / "notes.txt").write_text("not uploaded")
    assert main(["push", str(out), "someone/medusa-vllm"]) == 0
    assert (out / "README.md").is_file()  # written locally too
    up = fake_hub["upload"]
    assert up["files"] == ["README.md", "config.json", "draftheads_export.json", "model.safetensors"]
    assert speculative_configs(up["card"]) == [{"method": "medusa", "model": "someone/medusa-vllm", "num_speculative_tokens": 2}]


@pytest.mark.parametrize("what", ["run", "model", "empty", "repo_id"])
def test_push_refuses_what_is_not_heads_or_an_export(tmp_path, fake_hub, capsys, what, tiny_target_dir):
    folder, repo = tmp_path / "x", "someone/x"
    folder.mkdir()
    if what == "run":
        (folder / "heads").mkdir()
        (folder / "heads" / "config.json").write_text("{}")
        expected = "training run folder"
    elif what == "model":
        folder = tiny_target_dir
        expected = "neither a heads config"
    elif what == "empty":
        expected = "no config.json"
    else:
        repo, expected = "not a repo id", "not a Hub repo id"
    assert main(["push", str(folder), repo]) == 2
    assert expected in capsys.readouterr().err
    assert "upload" not in fake_hub and "create" not in fake_hub
