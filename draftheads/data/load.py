"""Read a raw dataset (rows of untokenized text or conversations) from wherever the config points.

Kept apart from formatting and tokenization so a new source (another file type)
touches one small function, and so a wrong path fails here, early, with the path in the message,
instead of deep inside ``datasets`` with a message about a builder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

import datasets

from .config import DataConfig
from .json_check import columns as json_columns
from .json_check import json_problem, row_lines, utf8_problem

# File suffix -> the ``datasets`` packaged builder that reads it.
_BUILDERS: dict[str, str] = {
    ".json": "json",
    ".jsonl": "json",
    ".json.gz": "json",
    ".jsonl.gz": "json",
    ".parquet": "parquet",
}

# ``owner/name`` as the hub spells repository ids (no leading dot, no further slashes).
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def load_raw_dataset(cfg: DataConfig, *, eval: bool = False) -> datasets.Dataset:
    """The raw rows of the training source, or of the eval source with ``eval=True``.

    The eval source is ``cfg.eval_path`` (default: ``cfg.path``) at ``cfg.eval_split`` (default:
    ``cfg.split``); it only exists when one of those two is set (see ``DataConfig``).
    """
    path = require_data_path(cfg)
    if eval:
        if not cfg.has_eval_source:
            raise ValueError("this DataConfig has no eval_path/eval_split; the eval rows are a share of the train rows")
        check_eval_source(cfg)
        path, split = cfg.eval_path or path, cfg.eval_split or cfg.split
    else:
        split = cfg.split
    return load_source(path, split, cache_dir=cfg.cache_dir)


def require_data_path(cfg: DataConfig) -> str:
    """``cfg.path``, or an error saying how to name the training data (it has no default)."""
    if cfg.path is None:
        raise ValueError(
            "data.path is not set: name the training data in the config (data: {path: FILE}) or on the command "
            "line (data.path=FILE): a .json/.jsonl/.parquet file or folder of chats or text, or a hub dataset id; "
            "`draftheads distill --target smollm2 --synthesize 2000 --out data/smollm2-chats.jsonl` writes chats "
            "the target answers itself"
        )
    return cfg.path


def check_eval_source(cfg: DataConfig) -> None:
    """Refuse an eval source that would be the training rows: a local file has no named splits
    (``datasets`` reads any of them as the whole file), so ``eval_split`` alone cannot select
    held-out rows from it, and an ``eval_path`` that is the training file is no held-out set.
    Training calls it before loading anything, so a config without ``data.path`` fails here too."""
    path = require_data_path(cfg)
    if not Path(path).expanduser().exists():
        return
    if cfg.eval_path is None and cfg.eval_split is not None:
        raise ValueError(
            f"data.eval_split={cfg.eval_split!r} with the local data.path {cfg.path!r}: a local file has no named "
            f"splits, so this would evaluate on the training rows. Remove data.eval_split to hold out "
            f"data.eval_fraction (now {cfg.eval_fraction}) of the rows, disjoint from training, or give "
            "data.eval_path (a separate file)"
        )
    if cfg.eval_path is not None and Path(cfg.eval_path).expanduser().resolve() == Path(path).expanduser().resolve():
        raise ValueError(
            f"data.eval_path is the training file {cfg.path!r}: evaluation would run on the training rows. "
            "Remove data.eval_path to hold out data.eval_fraction of the rows, or give a separate file"
        )


def load_source(path: str, split: str = "train", *, cache_dir: str | None = None) -> datasets.Dataset:
    """One dataset from a local file/folder or a hub id."""
    local = Path(path).expanduser()
    if local.exists():
        files, builder = _local_files(local)
        files = [f for f in files if os.path.getsize(f) > 0]  # datasets fails obscurely on empty files
        if not files:
            raise ValueError(f"the data {path!r} has 0 rows (empty file); point data.path at a non-empty dataset")
        # A local file is one split: ``datasets`` names it "train" whatever the config says.
        try:
            ds = datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache_dir)
        except Exception as err:  # name the file: datasets' own messages talk about builders and splits
            if "corresponds to no data" in str(err):  # how datasets reports a file with no rows
                raise ValueError(f"the data {path!r} has 0 rows; point data.path at a non-empty dataset") from err
            problem = _first_problem(files, json_problem) if builder == "json" else None
            problem = problem or _column_problem(files, builder)
            raise ValueError(
                problem or f"cannot read {path!r} as {builder} ({type(err).__name__}: {err}); is the file corrupt?"
            ) from err
        if builder == "json":
            # pyarrow keeps bytes that are not UTF-8; they would fail inside tokenization, unnamed.
            problem = _first_problem(files, utf8_problem)
            if problem:
                raise ValueError(problem)
        return _as_dataset(ds, path)
    if not looks_like_hub_id(path):
        raise FileNotFoundError(
            f"data path {path!r} does not exist (resolved to {local.resolve()}); give an existing "
            f".json/.jsonl/.parquet file or folder, or a hub dataset id 'owner/name'"
        )
    ds = datasets.load_dataset(path, split=split, cache_dir=cache_dir)
    return _as_dataset(ds, path)


class RowPlaces:
    """Where each row of a loaded source sits, for error messages: ``FILE line N`` (counted from
    1, as editors count) for local JSON-lines files, else ``row N`` (from 1). The line numbers are
    read only when a message needs one (an error), never for a healthy run."""

    def __init__(self, files: Sequence[str] = ()) -> None:
        self.files = list(files)
        self._lines: list[list[int]] | None = None

    def __call__(self, row: int) -> str:
        if self.files:
            if self._lines is None:
                found = [row_lines(f) for f in self.files]
                self._lines = [lines for lines in found if lines is not None] if all(found) else []
            index = row
            for file, lines in zip(self.files, self._lines):
                if index < len(lines):
                    return f"{file} line {lines[index]}"
                index -= len(lines)
        return f"row {row + 1}"

    def at(self, row: int) -> "_Place":
        """The place of ``row``, worked out only when printed."""
        return _Place(self, row)

    def __getstate__(self) -> dict:  # datasets hashes the tokenizing function: only the files count
        return {"files": self.files}

    def __setstate__(self, state: dict) -> None:
        self.files, self._lines = state["files"], None


class _Place:
    def __init__(self, places: RowPlaces, row: int) -> None:
        self.places, self.row = places, row

    def __str__(self) -> str:
        return self.places(self.row)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def row_places(path: str) -> RowPlaces:
    """The `RowPlaces` of the source ``load_source(path)`` reads (its local JSON files, in the
    order they are read; none for a hub dataset or parquet files)."""
    local = Path(path).expanduser()
    if not local.exists():
        return RowPlaces()
    try:
        files, builder = _local_files(local)
    except (ValueError, FileNotFoundError):
        return RowPlaces()
    files = [f for f in files if os.path.getsize(f) > 0]
    return RowPlaces(files if builder == "json" else ())


def _column_problem(files: list[str], builder: str) -> str | None:
    """Files of one folder whose rows hold different fields, named with their fields (None: one
    set of fields, or a single file)."""
    if len(files) < 2:
        return None
    if builder == "json":
        found = {f: json_columns(f) for f in files}
    else:
        try:
            import pyarrow.parquet as pq

            found = {f: list(pq.read_schema(f).names) for f in files}
        except Exception:  # noqa: BLE001 (an unreadable file: the caller's message covers it)
            return None
    kinds: dict[tuple[str, ...], list[str]] = {}
    for file, cols in found.items():
        kinds.setdefault(tuple(sorted(cols)), []).append(file)
    if len(kinds) < 2:
        return None
    groups = [f"{', '.join(fs[:3])}{' ...' if len(fs) > 3 else ''} hold {sorted(cols)}" for cols, fs in kinds.items()]
    return ("the data files do not share their fields: " + "; ".join(groups)
            + ". Keep one format per data folder (or point data.path at one of the files)")


def _first_problem(files: list[str], check) -> str | None:
    for f in files:
        problem = check(f)
        if problem:
            return problem
    return None


def looks_like_hub_id(path: str) -> bool:
    """``owner/name`` that is not obviously a file path (no data-file suffix, not absolute/relative)."""
    if path.startswith((".", "/", "~")) or os.sep != "/" and os.sep in path:
        return False
    if _suffix(path) in _BUILDERS:
        return False
    return bool(_HUB_ID.match(path))


def _suffix(name: str) -> str:
    lower = name.lower()
    for suffix in sorted(_BUILDERS, key=len, reverse=True):
        if lower.endswith(suffix):
            return suffix
    return ""


def _local_files(local: Path) -> tuple[list[str], str]:
    """The data files at ``local`` and the one builder that reads them all."""
    if local.is_file():
        suffix = _suffix(local.name)
        if suffix not in _BUILDERS:
            raise ValueError(
                f"data file {str(local)!r} has an unsupported extension; use one of {', '.join(_BUILDERS)}"
            )
        return [str(local)], _BUILDERS[suffix]
    files = sorted(
        p for p in local.rglob("*") if p.is_file() and _suffix(p.name) in _BUILDERS and not p.name.startswith(".")
    )
    if not files:
        raise FileNotFoundError(
            f"data folder {str(local)!r} holds no {'/'.join(_BUILDERS)} files"
        )
    builders = {_BUILDERS[_suffix(p.name)] for p in files}
    if len(builders) > 1:
        raise ValueError(
            f"data folder {str(local)!r} mixes json and parquet files; keep one kind per folder"
        )
    return [str(p) for p in files], builders.pop()


def _as_dataset(ds: object, path: str) -> datasets.Dataset:
    if not isinstance(ds, datasets.Dataset):
        raise TypeError(f"loading {path!r} gave a {type(ds).__name__}, expected one split (a datasets.Dataset)")
    return ds
