"""Exported heads served the way users serve them: ``vllm serve`` (the OpenAI-compatible server),
started once on 127.0.0.1 with one exported drafter (Medusa) on a tiny random Llama, asked for one
greedy completion over HTTP, stopped.

Checked: the completion equals transformers' greedy ``generate`` on the same target, token for token,
and the server's ``/metrics`` show the drafter at work with the acceptance per draft position that
draftheads' own chain decoding of the same heads gives (counted as vLLM counts:
tests/engines/vllm_counting.py), so the server really drafted with the exported heads.

Same rule as tests/test_vllm_engine.py: skipped without the vLLM venv, failed under ``CI``.
"""
from __future__ import annotations

import torch

import draftheads as dh
from engines.vllm_counting import decode_budget, vllm_counts
from engines.vllm_server import VllmServer
from test_vllm_engine import K, VOCAB, greedy, identity_plus_noise, tiny_llama_target, vllm_python

MAX_TOKENS = 32
PROMPT_LEN = 8
SERVER_ARGS = ["--dtype", "float32", "--max-model-len", "256", "--enforce-eager", "--max-num-seqs", "2",
               "--skip-tokenizer-init", "--seed", "0"]


def test_vllm_serve_with_exported_medusa_completes_exactly_greedy(tmp_path):
    python = vllm_python()
    from draftheads.export import export_heads

    target = tiny_llama_target(tmp_path / "target")
    heads = identity_plus_noise(target, "medusa", 0.2)
    heads.save_pretrained(tmp_path / "heads")
    export = export_heads(tmp_path / "heads", tmp_path / "vllm-medusa", "vllm", verifier=str(tmp_path / "target"),
                          num_speculative_tokens=K)
    prompt = torch.randint(3, VOCAB, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    expected = greedy(target, prompt, MAX_TOKENS)[0, PROMPT_LEN:].tolist()

    config = {"method": "medusa", "model": str(export), "num_speculative_tokens": K}
    server = VllmServer(str(python), str(tmp_path / "target"), tmp_path / "vllm-serve.log", config, SERVER_ARGS)
    with server:
        assert server.proc.poll() is None
        out = server.complete(prompt[0].tolist(), MAX_TOKENS)
        counters = server.metrics()
    assert server.proc.poll() is not None, "the server outlived its `with` block"
    print(f"vllm serve ready after {server.startup_seconds:.1f} s")

    assert out["token_ids"] == expected
    chain = dh.SpeculativeDecoder(target, dh.load_heads(tmp_path / "heads", target=target), tree=dh.TreeShape.chain(K))
    ours = chain.generate(prompt, max_new_tokens=decode_budget(MAX_TOKENS, K), eos_token_id=[])
    drafts, per_pos = vllm_counts(ours.accept_lengths, MAX_TOKENS, K)
    assert (counters["num_drafts"], counters["accepted_per_pos"]) == (drafts, per_pos)
    assert 0 < per_pos[0] < drafts  # the heads drafted, sometimes right, sometimes wrong


def test_spec_decode_counters_are_read_from_prometheus_text():
    """The /metrics reader (no server needed): counters summed over engines, positions in order."""
    from engines.vllm_server import counters_difference, parse_spec_metrics

    text = "\n".join([
        "# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.",
        "# TYPE vllm:spec_decode_num_drafts_total counter",
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 36.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 17.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0',
        'vllm:num_requests_running{engine="0",model_name="m"} 0.0',
    ])
    got = parse_spec_metrics(text)
    assert got == {"num_drafts": 12, "num_draft_tokens": 36, "num_accepted_tokens": 17, "accepted_per_pos": [9, 6, 2]}
    before = {"num_drafts": 2, "num_draft_tokens": 6, "num_accepted_tokens": 3, "accepted_per_pos": []}
    assert counters_difference(got, before)["accepted_per_pos"] == [9, 6, 2]
    assert parse_spec_metrics("")["accepted_per_pos"] == []  # plain serving: no spec-decode counters
