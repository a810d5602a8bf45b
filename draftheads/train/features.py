"""An offline cache of the target's features, so heads train without a target forward per step.

At 7B+ the frozen target's forward is almost the whole cost of a training step, paid again every
epoch. ``build_cache`` runs it once over the tokenized train/eval splits and stores, per example,
exactly what ``TargetWithHeads.forward`` reads from the target:

* ``hidden`` [T, H]: the last hidden state after the final norm (what the LM head reads). Medusa
  and Hydra heads read it; EAGLE reads it as its feature and learns the target's distribution
  from it through the target's LM head (full soft labels, so no top-k approximation is cached).
* ``features`` [T, n*H] (EAGLE-3 only): the hidden states entering its feature layers, concatenated.
* ``target_labels`` [T] int32: the target's greedy next-token choices (``train.labels: target``),
  taken from the full-precision hidden state, so a bf16 cache does not change them.

Layout in DIR: ``{split}-{n:05d}.safetensors`` shards (tensors concatenated along tokens) and
``index.json`` (fingerprints, dtype, and per split ``rows``: [shard, token offset, length] per
example). Every shard is written to a temporary name and renamed; the index is rewritten
atomically after each shard, so a killed run resumes after its last complete shard.

Training with ``data.features: DIR`` recomputes the fingerprints (target config and a weight
sample, tokenizer, what the heads read, the data settings and a hash of the tokenized examples)
and refuses a cache that differs, naming what differs. The target is still loaded (the heads
borrow its embedding and LM head) but never run.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..atomic import TMP_TAG, write_file_atomically, write_text_atomically
from ..data.sampling import example_lengths

FORMAT_VERSION = 1
INDEX = "index.json"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}
# Data settings that change the tokenized examples (num_proc, cache_dir and features itself do not).
_DATA_KEYS = ("path", "split", "format", "text_field", "max_length", "eval_fraction", "eval_path", "eval_split",
              "max_samples", "seed", "chunk_text")


class FeatureCacheError(ValueError):
    """A cache that cannot be used or written, and what to do."""


# ---------------------------------------------------------------------------------------------
# Fingerprints
# ---------------------------------------------------------------------------------------------


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()[:16]


def target_fingerprint(target: torch.nn.Module) -> dict[str, Any]:
    """Config and a sample of every weight (name, shape, dtype, 64 values at fixed strides): two
    checkpoints of one architecture differ here without hashing gigabytes."""
    cfg = target.config.to_dict()
    cfg.pop("_name_or_path", None)
    cfg.pop("transformers_version", None)
    h = hashlib.sha256()
    for name, p in target.named_parameters():
        flat = p.detach().reshape(-1)
        if flat.numel() == 0:  # ZeRO-3 shard
            continue
        # float64: in float32 the last index of a weight past 2**24 values rounds up past its end
        idx = torch.linspace(0, flat.numel() - 1, min(64, flat.numel()), dtype=torch.float64).long().to(flat.device)
        h.update(f"{name}{tuple(p.shape)}{p.dtype}".encode())
        h.update(flat[idx].float().cpu().numpy().tobytes())
    return {"config": _sha(json.dumps(cfg, sort_keys=True, default=str).encode()), "weights": h.hexdigest()[:16]}


def tokenizer_fingerprint(tokenizer: Any) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    specials = sorted(str(s) for s in (getattr(tokenizer, "all_special_tokens", None) or []))
    template = getattr(tokenizer, "chat_template", None) or ""
    return _sha(json.dumps(vocab).encode(), json.dumps(specials).encode(), str(template).encode())


def reads_fingerprint(heads: torch.nn.Module) -> dict[str, Any]:
    """What the heads read from the target: the last hidden state, plus EAGLE-3's feature layers."""
    layers = heads.feature_layers
    return {"head_type": heads.config.head_type, "feature_layers": list(layers) if layers else None}


def examples_fingerprint(dataset) -> str:
    """A hash of every example's ``input_ids`` and ``loss_mask``, in order."""
    h = hashlib.sha256()
    for batch in dataset.with_format("numpy").iter(batch_size=1024):
        for ids, mask in zip(batch["input_ids"], batch["loss_mask"]):
            h.update(len(ids).to_bytes(8, "little"))
            h.update(ids.astype("int64").tobytes())
            h.update(mask.astype("int8").tobytes())
    return h.hexdigest()[:16]


def fingerprint(cfg, target, tokenizer, heads, splits: dict[str, Any]) -> dict[str, Any]:
    data = {k: getattr(cfg.data, k) for k in _DATA_KEYS}
    data.update({f"{name}_examples": examples_fingerprint(ds) for name, ds in splits.items()})
    return {
        "target": {"name_or_path": cfg.target.name_or_path, **target_fingerprint(target)},
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "heads": reads_fingerprint(heads),
        "data": data,
    }


def _differences(cached: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(cached) | set(now)):
        a, b = cached.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: cache {a!r}, now {b!r}")
    return out


def _check_reads(cached: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """Medusa, Hydra and EAGLE read the same tensor (the last hidden state), so their caches are
    interchangeable; EAGLE-3 needs its own feature layers."""
    if cached.get("feature_layers") != now.get("feature_layers"):
        return [
            f"heads: the cache holds features for {cached.get('head_type')} (feature layers "
            f"{cached.get('feature_layers')}), these {now.get('head_type')} heads read feature layers "
            f"{now.get('feature_layers')}"
        ]
    return []


def check_fingerprint(directory: Path, cached: dict[str, Any], now: dict[str, Any]) -> None:
    """Raise, naming every difference, unless the cache was built for these inputs."""
    diffs = _check_reads(cached.get("heads", {}), now["heads"])
    target = _differences(cached.get("target", {}), now["target"], "target.")
    if any(not d.startswith("target.name_or_path") for d in target):  # a moved folder alone is no mismatch
        diffs += target
    if cached.get("tokenizer") != now["tokenizer"]:
        diffs.append(f"tokenizer: cache {cached.get('tokenizer')}, now {now['tokenizer']} (vocabulary, specials or chat template)")
    data = _differences(cached.get("data", {}), now["data"], "data.")
    if any(not d.startswith("data.path:") for d in data):  # a moved data file with the same examples is fine
        diffs += data
    if diffs:
        raise FeatureCacheError(
            f"the feature cache {directory} was built for other inputs: " + "; ".join(diffs)
            + ". Rebuild it with `draftheads cache-features` for this config, or train without data.features"
        )


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def _read_index(directory: Path) -> dict[str, Any] | None:
    path = directory / INDEX
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise FeatureCacheError(f"{path} is not valid JSON ({err}); delete {directory} and rebuild the cache") from err


def _write_index(directory: Path, index: dict[str, Any]) -> None:
    write_text_atomically(directory / INDEX, json.dumps(index) + "\n")


def bytes_per_token(hidden_size: int, feature_size: int, dtype: torch.dtype) -> int:
    item = torch.empty((), dtype=dtype).element_size()
    return (hidden_size + feature_size) * item + 4  # + int32 target label


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def build_cache(
    cfg,
    out: str | Path,
    model,
    tokenizer: Any,
    splits: dict[str, Any],
    *,
    dtype: str = "bfloat16",
    batch_size: int = 8,
    shard_bytes: int = 1 << 30,
    collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]],
    progress: bool = True,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Write (or finish) the cache of ``splits`` ({"train": ds, "eval": ds}) in ``out``.

    ``model`` is a ``TargetWithHeads``: its own feature methods produce what online training
    reads, so the cache cannot drift from it."""
    if dtype not in DTYPES:
        raise FeatureCacheError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    directory = Path(out)
    fp = fingerprint(cfg, model.target, tokenizer, model.heads, splits)
    layers = fp["heads"]["feature_layers"]
    hidden_size = int(model.target.get_output_embeddings().weight.shape[1])
    feature_size = hidden_size * len(layers) if layers else 0
    index = _resumable_index(directory, fp, torch_dtype)
    if index is not None and index.get("complete"):
        say(f"{directory}: the cache is complete, nothing to do")
        return index
    if index is None:
        index = _new_index(fp, torch_dtype, hidden_size, feature_size, splits)
    directory.mkdir(parents=True, exist_ok=True)
    _remove_half_written(directory)
    per_token = bytes_per_token(hidden_size, feature_size, torch_dtype)
    _check_disk_space(directory, index, splits, per_token, say)

    _write_index(directory, index)
    device = model.target.get_output_embeddings().weight.device
    for name, ds in splits.items():
        shards = _ShardWriter(directory, index, name, torch_dtype, with_features=bool(feature_size))
        _cache_split(model, ds, shards, device, batch_size, collate, shard_bytes, per_token, progress)
    index["complete"] = True
    _write_index(directory, index)
    say(f"feature cache written to {directory}")
    return index


def _resumable_index(directory: Path, fp: dict[str, Any], torch_dtype: torch.dtype) -> dict[str, Any] | None:
    """The index of an earlier (possibly interrupted) cache of these inputs in ``directory``, or
    None for a new cache; refuses a folder that holds something else or a cache of other inputs."""
    index = _read_index(directory) if directory.exists() else None
    if index is None and directory.exists() and any(directory.iterdir()):
        raise FeatureCacheError(f"{directory} exists and is not a feature cache; choose an empty or new --out")
    if index is not None:
        check_fingerprint(directory, index["fingerprint"], fp)
        if index["dtype"] != str(torch_dtype).removeprefix("torch."):
            raise FeatureCacheError(
                f"{directory} holds a {index['dtype']} cache; resume with --dtype {index['dtype']} or choose another --out"
            )
    return index


def _new_index(fp: dict[str, Any], torch_dtype: torch.dtype, hidden_size: int, feature_size: int, splits) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "fingerprint": fp,
        "dtype": str(torch_dtype).removeprefix("torch."),
        "hidden_size": hidden_size,
        "feature_size": feature_size,
        "splits": {name: {"examples": len(ds), "shards": [], "rows": []} for name, ds in splits.items()},
        "complete": False,
    }


def _remove_half_written(directory: Path) -> None:
    """Files a killed run left half-written (never referenced by the index)."""
    for stray in [*directory.glob(".*.tmp"), *directory.glob(f".*{TMP_TAG}*")]:
        stray.unlink()


def _check_disk_space(directory: Path, index: dict[str, Any], splits, per_token: int, say) -> None:
    """Say what the cache costs; refuse to start when the rest of it does not fit on the disk."""
    hidden_size, feature_size = index["hidden_size"], index["feature_size"]
    lengths = {name: example_lengths(ds) for name, ds in splits.items()}
    need = {name: sum(n) * per_token for name, n in lengths.items()}
    left = sum(sum(n[len(index["splits"][name]["rows"]) :]) * per_token for name, n in lengths.items())
    free = shutil.disk_usage(directory).free
    say(
        f"feature cache: {', '.join(f'{n} {len(ds)} examples' for n, ds in splits.items())}; "
        f"{per_token} bytes/token ({index['dtype']}: hidden {hidden_size}"
        + (f" + features {feature_size}" if feature_size else "")
        + f" + int32 label); total {_human(sum(need.values()))}, still to write {_human(left)}, free {_human(free)}"
    )
    if left > free:
        raise FeatureCacheError(
            f"not enough disk for the feature cache in {directory}: it needs {_human(left)} more, "
            f"{_human(free)} are free; free space, choose another --out, or use --dtype bfloat16"
        )


class _ShardWriter:
    """The rows of one split collected into shard files: each shard is written atomically, then
    the index is rewritten to list it, so a killed run resumes after its last complete shard."""

    def __init__(self, directory: Path, index: dict[str, Any], name: str, dtype: torch.dtype, with_features: bool) -> None:
        self.directory, self.index, self.name = directory, index, name
        self.part = index["splits"][name]
        self.dtype, self.with_features = dtype, with_features
        self.pending: dict[str, list[torch.Tensor]] = {"hidden": [], "features": [], "target_labels": []}
        self.rows: list[tuple[int, int]] = []  # (offset, length) within the shard being filled
        self.tokens = 0  # the shard's tokens so far (the next row's offset)

    @property
    def done(self) -> int:
        """Examples already in complete shards."""
        return len(self.part["rows"])

    def add(self, hidden: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, n: int) -> None:
        """One example's first ``n`` positions."""
        self.pending["hidden"].append(hidden[:n].to("cpu", self.dtype))
        if self.with_features:
            self.pending["features"].append(features[:n].to("cpu", self.dtype))
        self.pending["target_labels"].append(labels[:n].to("cpu", torch.int32))
        self.rows.append((self.tokens, n))
        self.tokens += n

    def flush(self) -> None:
        """Write the pending rows as the split's next shard and list it in the index."""
        if not self.rows:
            return
        shard = len(self.part["shards"])
        fname = f"{self.name}-{shard:05d}.safetensors"
        tensors = {k: torch.cat(v).contiguous() for k, v in self.pending.items() if v}
        write_file_atomically(self.directory / fname, lambda tmp: save_file(tensors, str(tmp)))
        self.part["shards"].append(fname)
        self.part["rows"].extend([shard, o, n] for o, n in self.rows)
        _write_index(self.directory, self.index)
        for v in self.pending.values():
            v.clear()
        self.rows.clear()
        self.tokens = 0


def _cache_split(model, ds, shards: _ShardWriter, device, batch_size: int, collate, shard_bytes: int, per_token: int,
                 progress: bool) -> None:
    """Run the target over the split's examples not cached yet, ``batch_size`` at a time."""
    start = shards.done
    bar = tqdm(total=len(ds), initial=start, desc=f"cache {shards.name}", unit="ex", disable=not progress, dynamic_ncols=True)
    for lo in range(start, len(ds), batch_size):
        rows = [ds[i] for i in range(lo, min(lo + batch_size, len(ds)))]
        batch = collate(rows)
        hidden, feats, labels = model.target_outputs(batch["input_ids"].to(device), batch["attention_mask"].to(device))
        for r, row in enumerate(rows):
            shards.add(hidden[r], feats[r], labels[r], len(row["input_ids"]))
        if shards.tokens * per_token >= shard_bytes:
            shards.flush()
        bar.update(len(rows))
    shards.flush()
    bar.close()


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------


class FeatureDataset(torch.utils.data.Dataset):
    """Tokenized examples joined with their cached target features, row by row."""

    def __init__(self, examples, directory: Path, rows: Sequence[Sequence[int]], shards: Sequence[str], features: bool) -> None:
        self.examples, self.directory = examples, Path(directory)
        self.rows, self.shards, self.has_features = list(rows), list(shards), features
        self._open: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> list[int]:
        return [int(r[2]) for r in self.rows]

    def select(self, indices) -> FeatureDataset:
        indices = list(indices)
        return FeatureDataset(
            self.examples.select(indices), self.directory, [self.rows[i] for i in indices], self.shards, self.has_features
        )

    def _shard(self, i: int):
        if i not in self._open:
            self._open[i] = safe_open(str(self.directory / self.shards[i]), framework="pt")
        return self._open[i]

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers open their own handles
        return {**self.__dict__, "_open": {}}

    def __getitem__(self, i: int) -> dict[str, Any]:
        shard, offset, length = self.rows[i]
        f = self._shard(shard)
        row = dict(self.examples[i])
        if len(row["input_ids"]) != length:
            raise FeatureCacheError(f"feature cache row {i} has {length} tokens, the example {len(row['input_ids'])}")
        row["hidden"] = f.get_slice("hidden")[offset : offset + length]
        if self.has_features:
            row["features"] = f.get_slice("features")[offset : offset + length]
        row["target_labels"] = f.get_slice("target_labels")[offset : offset + length]
        return row


class FeatureCollator:
    """The token collator plus the cached tensors, right-padded with zeros like the tokens (padded
    positions are masked out of attention and loss, so their values are never read)."""

    KEYS = ("hidden", "features", "target_labels")

    def __init__(self, base: Callable) -> None:
        self.base = base

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.base([{"input_ids": ex["input_ids"], "loss_mask": ex["loss_mask"]} for ex in examples])
        length = batch["input_ids"].shape[1]
        for key in self.KEYS:
            if key not in examples[0]:
                continue
            first = examples[0][key]
            out = first.new_zeros((len(examples), length, *first.shape[1:]))
            for i, ex in enumerate(examples):
                out[i, : ex[key].shape[0]] = ex[key]
            batch[key] = out.long() if key == "target_labels" else out
        return batch


def open_cache(cfg, target, tokenizer, heads, train_ds, eval_ds, collator) -> tuple[Any, Any, FeatureCollator]:
    """``(train, eval, collator)`` reading ``cfg.data.features``; refuses a cache built for other
    inputs (see ``check_fingerprint``) or one that is not complete."""
    directory = Path(cfg.data.features)
    index = _read_index(directory)
    if index is None:
        raise FeatureCacheError(
            f"data.features={str(directory)!r} holds no {INDEX}; build it with "
            f"`draftheads cache-features --config CONFIG --out {directory}`"
        )
    splits = {"train": train_ds} | ({"eval": eval_ds} if eval_ds is not None else {})
    now = fingerprint(cfg, target, tokenizer, heads, splits)
    if set(index["splits"]) != set(splits):
        raise FeatureCacheError(
            f"the feature cache {directory} holds the splits {sorted(index['splits'])}, this config has {sorted(splits)}"
        )
    check_fingerprint(directory, index["fingerprint"], now)
    if not index.get("complete"):
        raise FeatureCacheError(f"the feature cache {directory} is incomplete; finish it by running cache-features again")
    has_features = bool(index.get("feature_size"))
    out = [
        FeatureDataset(ds, directory, index["splits"][name]["rows"], index["splits"][name]["shards"], has_features)
        for name, ds in splits.items()
    ]
    return out[0], (out[1] if eval_ds is not None else None), FeatureCollator(collator)
