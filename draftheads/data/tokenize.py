"""Rows -> tokenized training examples with a per-token loss mask, and the train/eval datasets.

Convention (shared with the losses): ``loss_mask[t] == 1`` means token ``t`` itself is a training
target. The loss for predicting token ``t`` uses the logits at position ``t - 1`` and
``loss_mask[t]``; a head that looks ``k`` tokens further ahead uses ``loss_mask[t + k]``. So
``loss_mask[0]`` is always 0: nothing precedes the first token, it can never be a target.

* Chat rows: ``apply_chat_template`` ids; 1 only on assistant turns (see ``chat_mask``), then
  truncated to ``max_length``.
* Plain text rows: bos (when the tokenizer has one) + text + eos, the way causal LMs are
  pretrained; every token is a target. Long rows are cut into windows of ``max_length`` (with
  ``chunk_text``) that overlap by one token, so every token but the very first is a target exactly
  once; the overlap token is context only. Without ``chunk_text`` the row is truncated.
* Rows that end up with no target (empty text, an empty conversation, a conversation whose
  assistant turns lie past ``max_length`` or that has none) are dropped and counted in
  ``DataStats``: a dataset that loses most of its rows should say so, not shrink silently.
* Rows ``distill`` wrote carry the target's exact ids (``_token_ids``, see ``exact_ids``): they are
  used instead of tokenizing the text, which would give other tokens where the target wrote a
  byte that is not valid UTF-8 or a non-canonical split. A row whose ids no longer decode to its
  text (edited since) or whose template gives them no exact place falls back to its text, counted.
* Training rows that hold an evaluation question (``eval_overlap``) are refused, dropped or
  warned about (``data.eval_overlap``), so heads are never measured on their training prompts.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import datasets

from .chat_mask import (
    assistant_char_spans,
    check_chat_template,
    make_renderer,
    special_strings,
    tokenize_with_spans,
)
from .config import DataConfig
from .formats import CHAT_FORMATS, Message, detect_format, normalize_chat
from .eval_overlap import describe, first_match, texts_to_check
from .exact_ids import TOKEN_IDS, IdsDoNotMatch, NotSpliceable, spliced_chat, text_ids
from .load import RowPlaces, load_raw_dataset, row_places

logger = logging.getLogger(__name__)

ROW_COLUMN = "_row"  # index of the row in its source, so errors name the row a user can find
_STATUS, _TRAINABLE, _IDS = "_status", "_trainable", "_ids"
OK, EMPTY, NO_TRAINABLE = "ok", "empty", "no_trainable"
# how a row's ids were made: from its text, from the target's stored ids, or from its text because
# the stored ids could not be used
TEXT, EXACT, IDS_UNUSED = 0, 1, 2

FEATURES = datasets.Features(
    {
        "input_ids": datasets.List(datasets.Value("int32")),
        "loss_mask": datasets.List(datasets.Value("int8")),
        ROW_COLUMN: datasets.Value("int64"),
        _STATUS: datasets.Value("string"),
        _TRAINABLE: datasets.Value("int64"),
        _IDS: datasets.Value("int8"),
    }
)

Example = tuple[list[int], list[int]]


@dataclass
class DataStats:
    """What happened to the rows of one split; ``eval`` holds the eval split's counts."""

    source: str
    format: str
    rows_read: int = 0
    rows_kept: int = 0
    dropped_empty: int = 0
    dropped_no_trainable: int = 0
    dropped_eval_overlap: int = 0  # rows holding an evaluation question (data.eval_overlap: drop)
    rows_exact_ids: int = 0  # rows trained on the target's stored ids (distill's _token_ids)
    rows_ids_unused: int = 0  # rows whose stored ids could not be used (edited text, template): text tokenized
    examples: int = 0
    trainable_tokens: int = 0
    eval: DataStats | None = field(default=None)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        line = (
            f"{self.source} ({self.format}): {self.rows_read} rows read, {self.rows_kept} kept, "
            f"{self.dropped_empty} empty, {self.dropped_no_trainable} without trainable tokens; "
            f"{self.examples} examples, {self.trainable_tokens} trainable tokens"
        )
        if self.dropped_eval_overlap:
            line += f"; {self.dropped_eval_overlap} rows holding evaluation questions dropped"
        if self.rows_exact_ids or self.rows_ids_unused:
            line += f"; {self.rows_exact_ids} rows on the target's exact ids"
            line += f" ({self.rows_ids_unused} with ids unused: text tokenized)" if self.rows_ids_unused else ""
        return line if self.eval is None else f"train {line}\neval {self.eval.summary()}"


def tokenize_chat(
    tokenizer: Any,
    messages: Sequence[Message],
    max_length: int,
    *,
    specials: Sequence[str] | None = None,
    row: Any = "a row",
) -> Example:
    """One conversation as ``(input_ids, loss_mask)``, truncated to ``max_length``."""
    render = make_renderer(tokenizer)
    text, spans = assistant_char_spans(
        render, messages, specials if specials is not None else special_strings(tokenizer), row
    )
    ids, mask = tokenize_with_spans(tokenizer, text, spans)
    ids, mask = ids[:max_length], mask[:max_length]
    if mask:
        mask[0] = 0
    return ids, mask


def tokenize_text(tokenizer: Any, text: str, max_length: int, *, chunk: bool = True) -> list[Example]:
    """bos + text + eos as one or more ``(input_ids, loss_mask)`` windows of at most ``max_length``."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if tokenizer.bos_token_id is not None:
        ids.insert(0, tokenizer.bos_token_id)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return text_windows(ids, max_length, chunk=chunk)


def text_windows(ids: list[int], max_length: int, *, chunk: bool = True) -> list[Example]:
    """A plain-text row's ids as windows of at most ``max_length`` that overlap by one token."""
    if len(ids) <= max_length or not chunk:
        windows = [ids[:max_length]]
    else:
        stride = max_length - 1
        windows = [ids[s : s + max_length] for s in range(0, len(ids) - 1, stride)]
    return [(w, [0] + [1] * (len(w) - 1)) for w in windows]


class RowTokenizer:
    """The batched ``datasets.map`` function: a class (not a closure) so it pickles for num_proc."""

    def __init__(self, tokenizer: Any, fmt: str, cfg: DataConfig, places: RowPlaces | None = None) -> None:
        if fmt in CHAT_FORMATS:
            check_chat_template(tokenizer, cfg.path)
        self.places = places or RowPlaces()  # where a row sits in its files, for messages
        self.tokenizer = tokenizer
        self.fmt = fmt
        self.column = {"sharegpt": "conversations", "messages": "messages", "text": cfg.text_field}[fmt]
        self.max_length = cfg.max_length
        self.chunk = cfg.chunk_text
        self.specials = special_strings(tokenizer)

    def examples(self, value: Any, row: int, stored: Any = None) -> tuple[str, list[Example], int]:
        """The status of one row, its examples (none unless the status is OK) and how its ids were
        made (TEXT, EXACT: the target's ``stored`` ids, IDS_UNUSED: stored ids that could not be used)."""
        how = TEXT
        if self.fmt in CHAT_FORMATS:
            messages = normalize_chat(value, self.fmt, self.places.at(row))
            if not messages:
                return EMPTY, [], how
            out: list[Example] | None = None
            if stored is not None:
                try:
                    ids, mask = spliced_chat(self.tokenizer, messages, stored, specials=self.specials, row=row)
                except (NotSpliceable, IdsDoNotMatch):
                    how = IDS_UNUSED
                else:
                    ids, mask = ids[: self.max_length], mask[: self.max_length]
                    if mask:
                        mask[0] = 0
                    out, how = [(ids, mask)], EXACT
            if out is None:
                out = [tokenize_chat(self.tokenizer, messages, self.max_length, specials=self.specials,
                                     row=self.places.at(row))]
        else:
            if value is None or (isinstance(value, str) and not value.strip()):
                return EMPTY, [], how
            if not isinstance(value, str):
                raise ValueError(f"{self.places(row)}: {self.column!r} must be a string, got {type(value).__name__}")
            out = None
            if stored is not None:
                try:
                    out, how = text_windows(text_ids(self.tokenizer, value, stored, row), self.max_length, chunk=self.chunk), EXACT
                except IdsDoNotMatch:
                    how = IDS_UNUSED
            if out is None:
                out = tokenize_text(self.tokenizer, value, self.max_length, chunk=self.chunk)
        out = [ex for ex in out if any(ex[1])]
        return (OK, out, how) if out else (NO_TRAINABLE, [], how)

    def missing_field(self, batch: dict[str, list[Any]], i: int, metadata: set[str]) -> str | None:
        """Why row ``i`` of ``batch`` is an error rather than an empty row: it has no value in the
        column the format reads but holds text in a field that rows with that column do not have
        (a row written with another field name, e.g. ``txt``: counting it as empty would drop it
        without a word). ``metadata``: the fields that do come with the column (an id, a url), which
        say nothing. None otherwise."""
        if batch[self.column][i] is not None:
            return None
        others = [c for c in batch if c not in metadata and c not in (self.column, ROW_COLUMN) and _holds_content(batch[c][i])]
        if not others:
            return None
        row = batch[ROW_COLUMN][i]
        hint = f"set data.text_field={others[0]} if that is its text, " if self.fmt == "text" else ""
        return (
            f"{self.places(row)} has no {self.column!r} field (looked for {self.column!r}: data.format is {self.fmt}) but "
            f"holds {', '.join(repr(c) for c in others)}; {hint}rename the field in that row, or remove the row"
        )

    def __call__(self, batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        cols: dict[str, list[Any]] = {name: [] for name in FEATURES}
        present = [j for j, v in enumerate(batch[self.column]) if v is not None]
        metadata = {c for c in batch if any(batch[c][j] is not None for j in present)}
        stored = batch.get(TOKEN_IDS) or [None] * len(batch[ROW_COLUMN])
        for i, (value, row) in enumerate(zip(batch[self.column], batch[ROW_COLUMN])):
            problem = self.missing_field(batch, i, metadata)
            if problem:
                raise ValueError(problem)
            status, examples, how = self.examples(value, row, stored[i])
            # A dropped row still leaves one marker row, so the counts survive num_proc workers.
            for ids, mask in examples or [([], [])]:
                cols["input_ids"].append(ids)
                cols["loss_mask"].append(mask)
                cols[ROW_COLUMN].append(row)
                cols[_STATUS].append(status)
                cols[_TRAINABLE].append(sum(mask))
                cols[_IDS].append(how)
        return cols


def _holds_content(value: Any) -> bool:
    """A non-empty string or list: what a misnamed text or conversation field would hold."""
    return isinstance(value, str) and bool(value.strip()) or isinstance(value, list) and bool(value)


def tokenize_dataset(
    raw: datasets.Dataset, tokenizer: Any, cfg: DataConfig, fmt: str, *, source: str, desc: str = "tokenize",
    places: RowPlaces | None = None,
) -> tuple[datasets.Dataset, DataStats]:
    """Map raw rows (with a ``_row`` column) to ``input_ids``/``loss_mask`` examples plus counts.
    ``places``: where the source's rows sit in its files (errors name ``FILE line N``)."""
    fn = RowTokenizer(tokenizer, fmt, cfg, places)
    mapped = raw.map(
        fn,
        batched=True,
        batch_size=256,
        remove_columns=raw.column_names,
        features=FEATURES,
        num_proc=cfg.num_proc,
        desc=desc,
    )
    statuses = Counter(mapped[_STATUS])
    stats = DataStats(
        source=source,
        format=fmt,
        rows_read=len(raw),
        dropped_empty=statuses[EMPTY],
        dropped_no_trainable=statuses[NO_TRAINABLE],
        examples=statuses[OK],
        trainable_tokens=int(sum(mapped[_TRAINABLE])),
    )
    stats.rows_kept = stats.rows_read - stats.dropped_empty - stats.dropped_no_trainable
    how = {row: made for row, made in zip(mapped[ROW_COLUMN], mapped[_IDS])}
    stats.rows_exact_ids = sum(1 for made in how.values() if made == EXACT)
    stats.rows_ids_unused = sum(1 for made in how.values() if made == IDS_UNUSED)
    if stats.rows_ids_unused:
        logger.warning(
            "%s: %d rows carry the target's token ids (%s) that could not be used: their text no longer decodes "
            "from them (edited after distill?) or the chat template does not write assistant turns verbatim after "
            "its generation prompt; their text was tokenized instead", source, stats.rows_ids_unused, TOKEN_IDS,
        )
    if stats.dropped_empty or stats.dropped_no_trainable:
        kept = mapped.filter(lambda s: [x == OK for x in s], input_columns=_STATUS, batched=True, num_proc=cfg.num_proc)
    else:
        kept = mapped
    return kept.remove_columns([_STATUS, _TRAINABLE, _IDS, ROW_COLUMN]), stats


def build_datasets(
    cfg: DataConfig, tokenizer: Any
) -> tuple[datasets.Dataset, datasets.Dataset | None, DataStats]:
    """Load, split, format and tokenize: ``(train, eval or None, stats)``.

    Eval rows come from ``eval_path``/``eval_split`` when set, else ``eval_fraction`` of the
    rows (at least one, when there are two rows or more; none when the fraction is 0).
    Raises ValueError when a split has no rows or keeps none.
    """
    raw_train = _prepare(load_raw_dataset(cfg), cfg)
    _require_rows(raw_train, cfg.path, "train")
    fmt = detect_format(raw_train.column_names, cfg.format, cfg.text_field)
    if fmt in CHAT_FORMATS:
        check_chat_template(tokenizer, cfg.path)
    raw_train, overlap_dropped = drop_eval_overlap(raw_train, cfg, fmt)

    raw_eval: datasets.Dataset | None = None
    eval_source = cfg.path
    if cfg.has_eval_source:
        raw_eval = _prepare(load_raw_dataset(cfg, eval=True), cfg)
        eval_source = f"{cfg.eval_path or cfg.path} [{cfg.eval_split or cfg.split}]"
        _require_rows(raw_eval, eval_source, "eval")
    elif cfg.eval_fraction > 0 and len(raw_train) >= 2:
        n_eval = min(len(raw_train) - 1, max(1, round(len(raw_train) * cfg.eval_fraction)))
        parts = raw_train.train_test_split(test_size=n_eval, seed=cfg.seed)
        raw_train, raw_eval = parts["train"], parts["test"]

    train_places = row_places(cfg.path)
    train, stats = tokenize_dataset(raw_train, tokenizer, cfg, fmt, source=cfg.path, desc="tokenize train",
                                    places=train_places)
    stats.dropped_eval_overlap = overlap_dropped
    _require_kept(stats, "train")
    eval_ds: datasets.Dataset | None = None
    if raw_eval is not None:
        eval_fmt = detect_format(raw_eval.column_names, cfg.format, cfg.text_field)
        eval_places = row_places(cfg.eval_path) if cfg.eval_path else train_places if not cfg.has_eval_source else None
        eval_ds, stats.eval = tokenize_dataset(
            raw_eval, tokenizer, cfg, eval_fmt, source=eval_source, desc="tokenize eval", places=eval_places
        )
        if stats.eval.examples == 0:
            if cfg.has_eval_source:
                _require_kept(stats.eval, "eval")
            logger.warning(
                "no held-out eval row kept a trainable token; training without eval (%s)", stats.eval.summary()
            )
            eval_ds = None
    logger.info("data: %s", stats.summary())
    return train, eval_ds, stats


def drop_eval_overlap(raw: datasets.Dataset, cfg: DataConfig, fmt: str) -> tuple[datasets.Dataset, int]:
    """The training rows without those that hold an evaluation question, and how many went
    (``data.eval_overlap``: refuse raises, warn keeps them; see ``eval_overlap``)."""
    column = {"sharegpt": "conversations", "messages": "messages", "text": cfg.text_field}[fmt]
    found = []
    places = row_places(cfg.path)  # a malformed chat row is named by its file and line
    for batch in raw.select_columns([column, ROW_COLUMN]).iter(batch_size=1024):
        for value, row in zip(batch[column], batch[ROW_COLUMN]):
            match = first_match(texts_to_check(value, fmt, places.at(row)))
            if match is not None:
                found.append((row, match))
    if not found:
        return raw, 0
    what = f"the train data {cfg.path!r}: {describe(found, len(raw))}"
    if cfg.eval_overlap == "refuse":
        raise ValueError(
            f"{what}; heads trained on them would be measured on their training data. Remove those rows, or set "
            "data.eval_overlap=drop (leave them out) or data.eval_overlap=warn (keep them)"
        )
    if cfg.eval_overlap == "warn":
        logger.warning("%s; kept (data.eval_overlap=warn): do not benchmark on them", what)
        return raw, 0
    bad = {row for row, _ in found}
    logger.warning("%s; left out (data.eval_overlap=drop)", what)
    kept = raw.filter(lambda rows: [r not in bad for r in rows], input_columns=ROW_COLUMN, batched=True)
    return kept, len(found)


def _prepare(raw: datasets.Dataset, cfg: DataConfig) -> datasets.Dataset:
    """Number the rows (for error messages) and apply ``max_samples``."""
    if ROW_COLUMN in raw.column_names:
        raw = raw.remove_columns(ROW_COLUMN)
    raw = raw.add_column(ROW_COLUMN, list(range(len(raw))))
    if cfg.max_samples is not None and len(raw) > cfg.max_samples:
        raw = raw.shuffle(seed=cfg.seed).select(range(cfg.max_samples))
    return raw


def _require_rows(raw: datasets.Dataset, source: str, split: str) -> None:
    if len(raw) == 0:
        raise ValueError(f"the {split} data {source!r} has 0 rows; point data.path at a non-empty dataset")


def _require_kept(stats: DataStats, split: str) -> None:
    if stats.examples == 0:
        raise ValueError(
            f"the {split} data {stats.source!r} kept 0 of {stats.rows_read} rows "
            f"({stats.dropped_empty} empty, {stats.dropped_no_trainable} with no trainable token within "
            f"max_length); check data.format/text_field, raise data.max_length, or use other data"
        )
