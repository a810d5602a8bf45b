"""Configuration of the data pipeline.

One dataclass so the YAML config maps onto it 1:1 and so every knob that changes which tokens a
head is trained on is written down in the experiment file (and its checkpoint), not hidden in code.
"""

from __future__ import annotations

from pathlib import Path

from pydantic.dataclasses import dataclass

from ..schema import CHECKED, Bool, Float, Int, Str
from ..smollm2 import RETIRED_DATA, retired_message
from .eval_overlap import OVERLAP_POLICIES

FORMATS = ("auto", "sharegpt", "messages", "text")
PACK_OVERFLOW = ("split", "drop")  # see data/packing.py


@dataclass(config=CHECKED)
class DataConfig:
    """Where the training text comes from and how it becomes token windows.

    path: a local ``.json``/``.jsonl``/``.parquet`` file or a folder of them, or a hub dataset id
        (``owner/name``). No default: a run names its data (``None`` until then, an error when the
        data is read). ``draftheads distill`` writes chats the target answers, from a prompt set or
        from prompts it writes itself (``--synthesize``).
    split: the split of a hub dataset. A local file is a single split, so it is ignored there.
    format: ``auto`` picks by the columns present (``conversations`` -> sharegpt,
        ``messages`` -> messages, ``text_field`` -> text).
    text_field: the column that holds plain text.
    max_length: tokens per example; longer chat rows are truncated, longer text rows are
        chunked (``chunk_text``) or truncated.
    eval_fraction: share of the rows held out for evaluation when no separate eval source is
        given (split at row level, so the chunks of one document never straddle train/eval).
    eval_path / eval_split: a separate evaluation source. Setting only ``eval_split`` takes
        that split of ``path`` (e.g. a hub dataset's ``validation``); ``eval_fraction`` is then
        unused.
    max_samples: cap on the rows read from each source (after a seeded shuffle), for quick runs.
    seed: seeds the shuffle behind ``max_samples`` and the train/eval split.
    num_proc: worker processes for ``datasets.map``.
    chunk_text: cut long plain-text rows into several windows instead of dropping the tail,
        which matters for code corpora whose files are far longer than ``max_length``.
    cache_dir: the ``datasets`` cache folder (``None``: the library default).
    features: a feature cache folder written by ``draftheads cache-features`` for this config:
        the heads read the target's features from it instead of running the target.
    packing: lay training rows end to end in windows of ``pack_length`` tokens, each row still
        attending only to itself (``data/packing.py``), instead of one padded row per example.
        Evaluation batches stay unpacked, so evaluation figures compare across runs.
    pack_length: the packing window (``None``: ``max_length``); longer than ``max_length``
        packs more rows per window.
    pack_overflow: what packing does with a row longer than the window: ``split`` it into
        pieces or ``drop`` it (either is counted in the log).
    eval_overlap: training rows that hold an evaluation question (MT-Bench, Spec-Bench: a user
        turn equal to one, or containing a long one, by normalised text; see data/eval_overlap.py):
        ``refuse`` (an error naming them), ``drop`` (leave them out, counted) or ``warn`` (keep them).
    """

    path: Str | None = None
    split: Str = "train"
    format: Str = "auto"
    text_field: Str = "text"
    max_length: Int = 2048
    eval_fraction: Float = 0.02
    eval_path: Str | None = None
    eval_split: Str | None = None
    max_samples: Int | None = None
    seed: Int = 0
    num_proc: Int | None = None
    chunk_text: Bool = True
    cache_dir: Str | None = None
    features: Str | None = None
    packing: Bool = False
    pack_length: Int | None = None
    pack_overflow: Str = "split"
    eval_overlap: Str = "refuse"

    def __post_init__(self) -> None:
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise ValueError(f"data.path must be a non-empty string, got {self.path!r}")
        for key, value in (("data.path", self.path), ("data.eval_path", self.eval_path)):
            if value in RETIRED_DATA and not Path(value).exists():
                raise ValueError(retired_message(key, value))
        if self.format not in FORMATS:
            raise ValueError(f"data.format={self.format!r} is not one of {', '.join(FORMATS)}")
        if self.max_length < 2:
            # One token has no predecessor, so it can never be a training target.
            raise ValueError(f"data.max_length must be at least 2, got {self.max_length}")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"data.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"data.max_samples must be >= 1 or None, got {self.max_samples}")
        if self.pack_length is not None and self.pack_length < 2:
            raise ValueError(f"data.pack_length must be at least 2 (or None: max_length), got {self.pack_length}")
        if self.pack_overflow not in PACK_OVERFLOW:
            raise ValueError(f"data.pack_overflow={self.pack_overflow!r} is not one of {', '.join(PACK_OVERFLOW)}")
        if self.eval_overlap not in OVERLAP_POLICIES:
            raise ValueError(f"data.eval_overlap={self.eval_overlap!r} is not one of {', '.join(OVERLAP_POLICIES)}")
        if self.num_proc is not None and self.num_proc < 1:
            raise ValueError(f"data.num_proc must be >= 1 or None, got {self.num_proc}")

    @property
    def has_eval_source(self) -> bool:
        """True when evaluation rows come from their own file/split instead of a held-out share."""
        return self.eval_path is not None or self.eval_split is not None

    @property
    def packing_window(self) -> int:
        """The tokens of one packed window."""
        return self.pack_length if self.pack_length is not None else self.max_length
