"""The benchmarks that measure what heads accept with a given tree count the heads alone, even when
the heads' plan (tree.json) puts prompt lookup in front of them.

An explicit ``tree=`` replaces the plan's tree, not its choice of prompt lookup: the vLLM
comparison once decoded the main job's heads behind lookup, whose copies accept more drafts than
vLLM's k, and failed after its whole vLLM run (the counts had no slot for them)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

import draftheads as dh
from draftheads.inference.proposers.hybrid import LookupThenHeads

from engines import vllm_counting
from inference_utils import self_distilled_heads, tiny_target

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def heads_with_lookup_plan(tmp_path_factory):
    """Medusa heads whose plan puts prompt lookup in front of a 2-token chain for every request."""
    target = tiny_target("llama")
    heads, prompts = self_distilled_heads(target, num_heads=2, steps=30)
    folder = tmp_path_factory.mktemp("heads")
    heads.save_pretrained(folder)
    plan = {"format_version": 3, "plans": [{"tree": [[0], [0, 0]], "prompt_lookup": True}]}
    (folder / "tree.json").write_text(json.dumps(plan))
    assert isinstance(dh.SpeculativeDecoder(target, dh.load_heads(folder, target=target)).proposer, LookupThenHeads)
    return target, folder, prompts


def test_the_vllm_comparison_counts_the_heads_alone(heads_with_lookup_plan, monkeypatch):
    target, folder, prompts = heads_with_lookup_plan
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_vllm_serving

    k, max_tokens = 2, 24
    # Prompts that repeat themselves: prompt lookup, in front, would copy more than k tokens a step.
    rows = [torch.cat([p, p, p]).tolist() for p in prompts[:3]]
    args = argparse.Namespace(k=k, max_tokens=max_tokens)
    got = bench_vllm_serving.draftheads_acceptance(target, str(folder), rows, args, vllm_counting)["per_prompt"]

    heads = dh.load_heads(folder, target=target)
    alone = dh.SpeculativeDecoder(target, heads, tree=dh.StaticTree.chain(k), draft_budget=None, batch_plan=None,
                                  prompt_lookup=False)
    expected = []
    for ids in rows:
        row = torch.tensor([ids])
        out = alone.generate(row, attention_mask=torch.ones_like(row), eos_token_id=[],
                             max_new_tokens=vllm_counting.decode_budget(max_tokens, k))
        expected.append(vllm_counting.vllm_counts(out.accept_lengths, max_tokens, k))
    assert got == expected
    assert sum(sum(pos) for _, pos in got) > 0  # the heads did accept drafts: the comparison is not empty
