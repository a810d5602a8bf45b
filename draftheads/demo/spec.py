"""What a demo target build is: the sentinel name, the metadata file, and the spec whose hash names the cache folder."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from dataclasses import dataclass

DEMO_TARGET = "demo"
"""The sentinel that configs use for "the embedded demo target" instead of a hub id or a path."""

METADATA_FILE = "draftheads_demo.json"
"""Written last into a build folder; its presence (with a matching build key) marks it complete."""

RECIPE_VERSION = 1
"""Bump when the build recipe changes in a way the spec fields do not capture (cache key input)."""

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"


@dataclass(frozen=True)
class DemoTargetSpec:
    """Every setting that determines the built model; its hash names the cache folder.

    The budget is a token count rather than a time limit so that a build is reproducible: the
    same spec on the same interpreter gives bit-identical weights whatever the machine's load.
    The shape was chosen by measurement ("The demo target's shape" in `git show 19f3628:benchmarks/README.md`): 8 thin
    layers rather than 4 wide ones at the same parameter count, so that one EAGLE draft layer is a
    small share of a target forward, as it is on a real 32-layer model, and the greedy text is less
    repetitive; the price is a somewhat higher held-out loss and a longer build.

    Three attention heads of 64 rather than four of 48 (same width and depth): vLLM's CPU build
    attends only with head sizes 32, 64, 80, ... 256, and refused 48 on AVX2 machines, so heads
    trained on the demo could not be served there.
    """

    # Tokenizer.
    vocab_size: int = 8192
    tokenizer_min_frequency: int = 2
    # Model.
    hidden_size: int = 192
    num_layers: int = 8
    num_heads: int = 3  # head size 64: a size every vLLM CPU build attends with
    num_kv_heads: int | None = None  # None: same as num_heads (plain multi-head attention)
    intermediate_size: int | None = None  # None: 8/3 * hidden, rounded up to a multiple of 64
    tie_embeddings: bool = True  # the embedding is a large share of a model this small: share it with the LM head
    # Training.
    seq_len: int = 512
    batch_size: int = 4
    max_tokens: int = 1_500_000  # about half an epoch of the corpus: a build of minutes on a CPU
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_fraction: float = 0.05
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    num_threads: int = 2  # torch threads while building (not part of the cache key)
    # Corpus.
    heldout_fraction: float = 0.05
    max_files: int | None = None  # cap on files per split, for tiny test builds
    eval_max_tokens: int | None = None  # cap on held-out tokens scored, for tiny test builds

    def resolved_intermediate_size(self) -> int:
        """Llama's usual MLP width (8/3 of hidden) unless set, rounded for matmul-friendly shapes."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        return int(math.ceil(self.hidden_size * 8 / 3 / 64) * 64)

    def build_key(self) -> str:
        """A short stable hash of the spec, the recipe version and the Python version.

        The Python version is part of it because the corpus is that interpreter's stdlib.
        ``num_threads`` is not: it changes speed and the last bits of float reductions, not
        what is built, so a cached target is reused whatever thread count asks for it.
        """
        settings = dataclasses.asdict(self)
        settings.pop("num_threads")
        payload = {
            "spec": settings,
            "recipe": RECIPE_VERSION,
            "python": ".".join(map(str, sys.version_info[:3])),
        }
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:12]
