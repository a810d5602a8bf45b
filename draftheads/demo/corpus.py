"""The demo corpus (the running interpreter's standard library sources), its file split, and the tokenizer trained on it."""

from __future__ import annotations

import hashlib
import os
import pathlib
import sysconfig
from functools import lru_cache

import torch

from .spec import BOS, EOS, PAD, DemoTargetSpec

# Folder names that hold tests or third-party code rather than the standard library proper.
_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> pathlib.Path:
    """The running interpreter's standard library folder: the corpus every machine has."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str, heldout_fraction: float = 0.05) -> bool:
    """A file's split, fixed by a hash of its relative path.

    sha1 rather than ``hash()`` because the latter is salted per process; the same file stays on
    the same side of the split across runs, machines and added or removed neighbours.
    """
    digest = hashlib.sha1(relative_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < heldout_fraction


@lru_cache(maxsize=4)
def _all_corpus_files(root: str) -> tuple[pathlib.Path, ...]:
    """All non-empty stdlib ``.py`` files outside test folders and site-packages, sorted.

    Excluded folders are pruned during the walk: site-packages can be far larger than the stdlib.
    Empty files (bare ``__init__.py``) are dropped since they add only bos/eos pairs.
    """
    found: list[pathlib.Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _EXCLUDED_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                path = pathlib.Path(dirpath, name)
                if path.stat().st_size and path.read_bytes().strip():
                    found.append(path)
    return tuple(sorted(found, key=lambda p: p.relative_to(root).as_posix()))


def corpus_files(
    split: str = "train",
    *,
    heldout_fraction: float = 0.05,
    max_files: int | None = None,
) -> list[pathlib.Path]:
    """Corpus files of one split ("train", "heldout" or "all"), in a deterministic order.

    ``max_files`` keeps the first files of each split (for tiny test builds); with "all" it caps
    the train and held-out parts separately, so the result is still their union.
    """
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    root = stdlib_root()
    files = _all_corpus_files(str(root))
    if not files:
        raise RuntimeError(f"no .py files found under the stdlib folder {root}; is this a full Python install?")
    heldout = [p for p in files if is_heldout(p.relative_to(root).as_posix(), heldout_fraction)]
    train = [p for p in files if not is_heldout(p.relative_to(root).as_posix(), heldout_fraction)]
    if max_files is not None:
        train, heldout = train[:max_files], heldout[:max_files]
    if split == "train":
        return train
    if split == "heldout":
        return heldout
    return sorted(train + heldout, key=lambda p: p.relative_to(root).as_posix())


def corpus_texts(
    split: str = "train",
    *,
    heldout_fraction: float = 0.05,
    max_files: int | None = None,
) -> list[str]:
    """The contents of ``corpus_files(split)``, same order (all stdlib sources are UTF-8)."""
    files = corpus_files(split, heldout_fraction=heldout_fraction, max_files=max_files)
    return [p.read_text(encoding="utf-8") for p in files]


def _relative(paths: list[pathlib.Path]) -> list[str]:
    root = stdlib_root()
    return [p.relative_to(root).as_posix() for p in paths]


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], spec: DemoTargetSpec):
    """A byte-level BPE tokenizer trained on ``texts``, wrapped for transformers.

    Byte-level so that any text (indentation, tabs, non-ASCII) round-trips exactly. The
    tokenizer prepends ``<|bos|>`` by default, as the model saw bos at the start of every file.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=spec.tokenizer_min_frequency,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=spec.seq_len,
        clean_up_tokenization_spaces=False,
    )
    _check_round_trip(wrapped, texts)
    return wrapped


def _check_round_trip(tokenizer, texts: list[str]) -> None:
    """Fail the build early if decoding does not reproduce the text byte for byte."""
    probe = [t[:1000] for t in texts[:8]] + ["def f(x):\n\treturn x  # tab, spaces, é, 中文\n"]
    for text in probe:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != text:
            raise RuntimeError(f"demo tokenizer does not round-trip text starting {text[:60]!r}")


def pack_documents(tokenizer, texts: list[str]) -> torch.Tensor:
    """One long token stream: each file wrapped as bos + text + eos, concatenated."""
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    stream: list[int] = []
    for enc in encodings:
        stream.append(bos)
        stream.extend(enc.ids)
        stream.append(eos)
    return torch.tensor(stream, dtype=torch.long)
