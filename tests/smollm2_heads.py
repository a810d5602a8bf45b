"""Draft heads for the real small target (SmolLM2-135M-Instruct), built once per test session.

The real-model tests (tests/test_real_target.py: exact decoding; tests/test_real_target_vllm.py:
vLLM's acceptance) need heads that draft SOMETHING the target accepts at every draft position:
heads that never accept would make an acceptance comparison vacuous and leave the accepting
branches of the decoder untested on a real model. Fresh heads accept nothing on a real model, so
EAGLE-3 heads are trained here, through the command line as a user would (``draftheads
cache-features`` then ``draftheads train``), for a few steps on the target's own greedy answers to
six short prompts (tests/data/smollm2_greedy.jsonl, written by ``draftheads distill`` with SmolLM2;
regenerate with::

    draftheads distill --target smollm2 --data tests/data/smollm2_prompts.jsonl \\
        --out tests/data/smollm2_greedy.jsonl --max-new-tokens 96 --temperature 0 --batch-size 6

). The tests decode those same prompts: the heads have seen their answers, which is what makes
them accept. Training on a 2-core CPU costs ~1 s of CPU per step (the target's LM head over every
window position dominates), the target's forward is paid once by the feature cache.

Under pytest-xdist the two test files may run in different workers: the heads are built in the
session's shared base folder under a file lock, so the first worker trains and the other waits
for them and reuses them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
GREEDY_ROWS = DATA / "smollm2_greedy.jsonl"
K = 3  # EAGLE-3 draft steps (training-time test depth) and the chain vLLM drafts
TRAIN_STEPS = 24
WINDOW = 80  # tokens per training row: the ~40-token chat prompt and the first ~40 answer tokens

EAGLE3_CONFIG = f"""
target:
  name_or_path: smollm2
  dtype: float32
heads:
  head_type: eagle3
  num_heads: {K}
  num_layers: 1
  draft_vocab_size: 512   # the most frequent tokens of the six answers: a cheap draft LM head
  init: torch
  lm_head_init: target
data:
  path: {GREEDY_ROWS}
  max_length: {WINDOW}
  eval_fraction: 0.0
train:
  output_dir: OUTPUT_DIR
  max_steps: {TRAIN_STEPS}
  batch_size: 6
  lr: 3.0e-3
  lr_schedule: constant
  eval_every: 0
  save_every: 0
  log_every: {TRAIN_STEPS}
  choose_tree: false      # no timing on a loaded test machine: the decoder's default tree
  loss_checkpointing: false
  mixed_precision: "no"
tracking:
  report_to: none
"""


def user_prompts() -> list[str]:
    """The user turns the heads were trained on, in file order."""
    rows = [json.loads(line) for line in GREEDY_ROWS.read_text().splitlines() if line.strip()]
    return [row["messages"][0]["content"] for row in rows]


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """``prompt`` as one user turn in the target's chat template, ready for the answer (what
    ``draftheads generate`` and ``distill`` feed the target)."""
    return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                              return_dict=True)["input_ids"])


def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder every xdist worker of this test session sees (the workers' common base temp)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


def _train_eagle3(root: Path) -> Path:
    from draftheads.cli import main

    config = root / "eagle3.yaml"
    config.write_text(EAGLE3_CONFIG.replace("OUTPUT_DIR", str(root / "run")))
    features = root / "features"
    assert main(["cache-features", "--config", str(config), "--out", str(features), "--dtype", "float32",
                 "--no-progress"]) == 0, "draftheads cache-features failed on SmolLM2"
    assert main(["train", "--config", str(config), f"data.features={features}"]) == 0, "draftheads train failed"
    heads = root / "run" / "heads"
    assert (heads / "config.json").is_file(), f"training wrote no heads folder at {heads}"
    return heads


def eagle3_heads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained EAGLE-3 heads folder: built by the first caller of the session, reused after."""
    from filelock import FileLock

    root = shared_folder(tmp_path_factory, "smollm2-eagle3")
    done = root / "heads-path"
    with FileLock(str(root) + ".lock"):
        if not done.is_file():
            root.mkdir(parents=True, exist_ok=True)
            done.write_text(str(_train_eagle3(root)))
    return Path(done.read_text())
