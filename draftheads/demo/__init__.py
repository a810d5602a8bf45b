"""The offline demo target: a small Llama-architecture code model built on this machine.

No model hub is reachable in the environments this project is developed and tested in, so the
embedded default target (``configs/demo.yaml`` names it ``"demo"``) is trained here, from a seed,
on the one real, licence-clean text every machine has: the Python standard library source of the
running interpreter. The result is an ordinary Hugging Face model folder (safetensors weights,
``config.json``, a fast tokenizer) plus ``draftheads_demo.json`` describing how it was made, cached
under ``~/.cache/draftheads`` so that only the first run pays for the build.

Usage::

    python -m draftheads.demo [--out DIR] [--max-tokens N]

or from code: ``resolve_target("demo")`` returns the folder path, building it when missing.

The package: ``spec`` (what a build is), ``corpus`` (stdlib files, split, tokenizer), ``pretrain``
(the model and its training loop), ``build`` (cache folder, lock, atomic install). The library
imports it only to resolve ``"demo"`` and to read the demo corpus.
"""

from .build import (
    build_demo_target,
    default_cache_root,
    default_target_dir,
    ensure_demo_target,
    is_complete,
    resolve_target,
    summary,
)
from .corpus import corpus_files, corpus_texts, is_heldout, pack_documents, stdlib_root, train_tokenizer
from .pretrain import heldout_loss, lr_at, make_model, train_model
from .spec import BOS, DEMO_TARGET, EOS, METADATA_FILE, PAD, RECIPE_VERSION, DemoTargetSpec

__all__ = [
    "BOS", "DEMO_TARGET", "EOS", "METADATA_FILE", "PAD", "RECIPE_VERSION", "DemoTargetSpec",
    "build_demo_target", "corpus_files", "corpus_texts", "default_cache_root", "default_target_dir",
    "ensure_demo_target", "heldout_loss", "is_complete", "is_heldout", "lr_at", "make_model",
    "pack_documents", "resolve_target", "stdlib_root", "summary", "train_model", "train_tokenizer",
]
