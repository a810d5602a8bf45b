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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import sys
import sysconfig
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import torch

from .atomic import install_folder, recover, temp_folder

DEMO_TARGET = "demo"
"""The sentinel that configs use for "the embedded demo target" instead of a hub id or a path."""

METADATA_FILE = "draftheads_demo.json"
"""Written last into a build folder; its presence (with a matching build key) marks it complete."""

RECIPE_VERSION = 1
"""Bump when the build recipe changes in a way the spec fields do not capture (cache key input)."""

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"

# Folder names that hold tests or third-party code rather than the standard library proper.
_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class DemoTargetSpec:
    """Every setting that determines the built model; its hash names the cache folder.

    The budget is a token count rather than a time limit so that a build is reproducible: the
    same spec on the same interpreter gives bit-identical weights whatever the machine's load.
    The defaults were chosen by measurement on 2 CPU cores (see the project notes): a model big
    enough that one forward is not dominated by Python overhead (so speculative decoding
    benchmarks against it mean something), trained on as many tokens as ~8 minutes allow.
    """

    # Tokenizer.
    vocab_size: int = 8192
    tokenizer_min_frequency: int = 2
    # Model.
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int | None = None  # None: same as num_heads (plain multi-head attention)
    intermediate_size: int | None = None  # None: 8/3 * hidden, rounded up to a multiple of 64
    tie_embeddings: bool = True  # measured: no worse than untied at equal tokens, 2.1 M fewer params
    # Training.
    seq_len: int = 512
    batch_size: int = 4
    max_tokens: int = 1_500_000  # ~8 min at ~3200 tok/s on 2 idle cores; ~0.5 epoch
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


# --------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Model and training
# --------------------------------------------------------------------------------------------


def pick_device() -> torch.device:
    """CUDA when present, else CPU; training stays fp32 either way for reproducibility."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_model(spec: DemoTargetSpec, tokenizer):
    """A freshly initialised LlamaForCausalLM; call after seeding torch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if spec.hidden_size % spec.num_heads:
        raise ValueError(f"hidden_size {spec.hidden_size} is not divisible by num_heads {spec.num_heads}")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.resolved_intermediate_size(),
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads or spec.num_heads,
        max_position_embeddings=spec.seq_len,
        tie_word_embeddings=spec.tie_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, total_steps: int, spec: DemoTargetSpec) -> float:
    """Linear warmup then cosine decay to ``min_lr_ratio * lr``."""
    warmup = max(1, int(total_steps * spec.warmup_fraction))
    if step < warmup:
        return spec.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * cosine)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: decaying norm gains pulls them towards zero for no benefit."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _batches(stream: torch.Tensor, spec: DemoTargetSpec, steps: int) -> Iterator[torch.Tensor]:
    """``steps`` batches of packed blocks, reshuffled every epoch by a seeded generator."""
    blocks = stream[: len(stream) // spec.seq_len * spec.seq_len].view(-1, spec.seq_len)
    if len(blocks) < spec.batch_size:
        raise ValueError(
            f"train split has {len(stream)} tokens, fewer than one batch of "
            f"{spec.batch_size} x {spec.seq_len}; lower batch_size/seq_len or raise max_files"
        )
    gen = torch.Generator().manual_seed(spec.seed)
    order = torch.randperm(len(blocks), generator=gen)
    pos = 0
    for _ in range(steps):
        if pos + spec.batch_size > len(order):
            order, pos = torch.randperm(len(blocks), generator=gen), 0
        yield blocks[order[pos : pos + spec.batch_size]]
        pos += spec.batch_size


def train_model(model, stream: torch.Tensor, spec: DemoTargetSpec, device: torch.device, progress: bool) -> dict:
    """Train in place for ``max_tokens`` (rounded down to whole steps); returns run statistics."""
    from tqdm.auto import tqdm

    tokens_per_step = spec.batch_size * spec.seq_len
    steps = max(1, spec.max_tokens // tokens_per_step)
    optimizer = torch.optim.AdamW(
        _param_groups(model, spec.weight_decay), lr=spec.lr, betas=(0.9, 0.95), eps=1e-8
    )
    model.train()
    bar = tqdm(total=steps * tokens_per_step, unit="tok", unit_scale=True, disable=not progress, desc="demo target")
    ema, start = None, time.perf_counter()
    for step, batch in enumerate(_batches(stream, spec, steps)):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, steps, spec)
        batch = batch.to(device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        value = loss.item()
        ema = value if ema is None else 0.98 * ema + 0.02 * value
        bar.update(tokens_per_step)
        elapsed = time.perf_counter() - start
        bar.set_postfix(loss=f"{ema:.3f}", tok_s=f"{(step + 1) * tokens_per_step / elapsed:.0f}", refresh=False)
    bar.close()
    seconds = time.perf_counter() - start
    model.eval()
    return {
        "steps": steps,
        "tokens_trained": steps * tokens_per_step,
        "train_seconds": seconds,
        "train_tokens_per_second": steps * tokens_per_step / seconds,
        "final_train_loss_ema": ema,
        "epochs": steps * tokens_per_step / len(stream),
    }


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, seq_len: int, device: torch.device, batch_size: int = 8) -> tuple[float, int]:
    """Mean next-token NLL (nats/token) over non-overlapping ``seq_len`` blocks of ``stream``.

    The same packing as training, so the figure is comparable to the training loss; the first
    token of each block has no context inside it and is not scored.
    """
    model.eval()
    total, count = 0.0, 0
    cut = len(stream) // seq_len * seq_len
    pieces = list(stream[:cut].view(-1, seq_len).split(batch_size)) if cut else []
    if len(stream) - cut >= 2:
        pieces.append(stream[cut:].unsqueeze(0))
    for piece in pieces:
        piece = piece.to(device)
        logits = model(input_ids=piece).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.size(-1)), piece[:, 1:].reshape(-1), reduction="sum"
        )
        total += nll.item()
        count += piece[:, 1:].numel()
    if count == 0:
        raise ValueError("held-out split has no tokens to score; raise max_files or heldout_fraction")
    return total / count, count


# --------------------------------------------------------------------------------------------
# Building and caching
# --------------------------------------------------------------------------------------------


def default_cache_root() -> pathlib.Path:
    """``$DRAFTHEADS_CACHE`` if set, else ``~/.cache/draftheads``."""
    env = os.environ.get("DRAFTHEADS_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path("~/.cache/draftheads").expanduser()


def default_target_dir(spec: DemoTargetSpec | None = None, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """Where the demo target for ``spec`` lives: ``<cache root>/demo-target-<build key>``."""
    spec = spec or DemoTargetSpec()
    root = pathlib.Path(cache_dir).expanduser() if cache_dir else default_cache_root()
    return root / f"demo-target-{spec.build_key()}"


def is_complete(folder: str | os.PathLike, spec: DemoTargetSpec | None = None) -> bool:
    """True when ``folder`` holds a finished build (of ``spec``, when given).

    Builds are installed by a directory rename, so a folder with the metadata written last, the
    weights and the tokenizer is a finished one; anything else is treated as absent.
    """
    folder = pathlib.Path(folder)
    meta_path = folder / METADATA_FILE
    needed = ("config.json", "model.safetensors", "tokenizer.json")
    if not meta_path.is_file() or not all((folder / name).is_file() for name in needed):
        return False
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return spec is None or meta.get("build_key") == spec.build_key()


@contextlib.contextmanager
def _build_lock(target: pathlib.Path) -> Iterator[None]:
    """An exclusive lock beside ``target`` so that concurrent builders do not race.

    Held around the check-then-build in ensure_demo_target and around stale-temp cleanup, so a
    second process waits for the first build and then reuses it.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, builds still install atomically
        yield
        return
    with open(target.parent / f"{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_into(folder: pathlib.Path, spec: DemoTargetSpec, progress: bool) -> dict:
    """Run every stage (tokenizer, packing, training, evaluation) and save into ``folder``."""
    device = pick_device()
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    train_files = corpus_files("train", heldout_fraction=spec.heldout_fraction, max_files=spec.max_files)
    heldout_files = corpus_files("heldout", heldout_fraction=spec.heldout_fraction, max_files=spec.max_files)
    train_texts = [p.read_text(encoding="utf-8") for p in train_files]
    heldout_texts = [p.read_text(encoding="utf-8") for p in heldout_files]
    if not train_texts or not heldout_texts:
        raise ValueError(
            f"demo corpus split is empty ({len(train_texts)} train, {len(heldout_texts)} held-out files); "
            "raise max_files or heldout_fraction"
        )

    t = time.perf_counter()
    tokenizer = train_tokenizer(train_texts, spec)
    times["tokenizer_s"] = time.perf_counter() - t

    t = time.perf_counter()
    train_stream = pack_documents(tokenizer, train_texts)
    heldout_stream = pack_documents(tokenizer, heldout_texts)
    if spec.eval_max_tokens is not None:
        heldout_stream = heldout_stream[: spec.eval_max_tokens]
    times["tokenize_s"] = time.perf_counter() - t

    torch.manual_seed(spec.seed)
    model = make_model(spec, tokenizer).to(device)
    run = train_model(model, train_stream, spec, device, progress)
    times["train_s"] = run.pop("train_seconds")

    t = time.perf_counter()
    loss, scored = heldout_loss(model, heldout_stream, spec.seq_len, device)
    times["eval_s"] = time.perf_counter() - t

    t = time.perf_counter()
    model.to("cpu").save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    times["save_s"] = time.perf_counter() - t
    times["total_s"] = time.perf_counter() - t0

    import transformers

    meta = {
        "build_key": spec.build_key(),
        "recipe_version": RECIPE_VERSION,
        "seed": spec.seed,
        "spec": dataclasses.asdict(spec),
        "model_config": model.config.to_dict(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokens_trained": run["tokens_trained"],
        **{k: v for k, v in run.items() if k != "tokens_trained"},
        "heldout_loss": loss,
        "heldout_loss_units": "nats/token",
        "heldout_tokens_scored": scored,
        "train_tokens_available": len(train_stream),
        "wall_time_s": times["total_s"],
        "stage_seconds": times,
        "files": {
            "train_count": len(train_files),
            "heldout_count": len(heldout_files),
            "heldout": _relative(heldout_files),
        },
        "corpus": {
            "source": "Python standard library .py files (test folders and site-packages excluded)",
            "stdlib": str(stdlib_root()),
            "python_version": ".".join(map(str, sys.version_info[:3])),
            "heldout_rule": f"sha1(relative path)[:8] / 2**64 < {spec.heldout_fraction}",
        },
        "device": str(device),
        "num_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    (folder / METADATA_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _build_locked(target: pathlib.Path, spec: DemoTargetSpec, progress: bool, reuse: bool) -> pathlib.Path:
    """Build ``spec`` into ``target`` under the lock (reusing a finished one when ``reuse``)."""
    with _build_lock(target):
        recover(target)  # a build killed mid-install: its previous copy back; leftovers removed
        for legacy in [*target.parent.glob(f"{target.name}.tmp-*"), *target.parent.glob(f"{target.name}.old-*")]:
            shutil.rmtree(legacy, ignore_errors=True)  # leftovers named by earlier versions
        if reuse and is_complete(target, spec):
            return target
        tmp = temp_folder(target)  # also removes leftovers of interrupted builds (we hold the lock)
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(spec.num_threads)
        try:
            _build_into(tmp, spec, progress)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            torch.set_num_threads(previous_threads)
        install_folder(tmp, target)
    return target


def build_demo_target(
    out_dir: str | os.PathLike | None = None,
    spec: DemoTargetSpec | None = None,
    progress: bool = True,
) -> pathlib.Path:
    """Build the demo target into ``out_dir`` (default: its cache folder), replacing what is there.

    The build is written into a temporary sibling folder and renamed into place only when
    finished, so an interrupted build never leaves a folder that looks complete.
    """
    spec = spec or DemoTargetSpec()
    target = pathlib.Path(out_dir).expanduser() if out_dir else default_target_dir(spec)
    return _build_locked(target.absolute(), spec, progress, reuse=False)


def ensure_demo_target(
    spec: DemoTargetSpec | None = None,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
) -> pathlib.Path:
    """The cached demo target folder for ``spec``, built first if missing or incomplete.

    ``cache_dir`` replaces the cache root (``$DRAFTHEADS_CACHE`` or ``~/.cache/draftheads``);
    the folder inside it is named by the spec's build key, so different specs never collide.
    """
    spec = spec or DemoTargetSpec()
    target = default_target_dir(spec, cache_dir).absolute()
    if is_complete(target, spec):
        return target
    return _build_locked(target, spec, progress, reuse=True)


def resolve_target(name_or_path: str) -> str:
    """Map the ``"demo"`` sentinel to the built demo target's folder; anything else unchanged."""
    if name_or_path == DEMO_TARGET:
        return str(ensure_demo_target())
    return name_or_path


def summary(folder: str | os.PathLike) -> str:
    """A few human-readable lines about a built demo target."""
    meta = json.loads((pathlib.Path(folder) / METADATA_FILE).read_text())
    spec, stages = meta["spec"], meta["stage_seconds"]
    return "\n".join(
        [
            f"demo target: {folder}",
            f"  model: Llama hidden {spec['hidden_size']} x {spec['num_layers']} layers, "
            f"{meta['parameters'] / 1e6:.2f} M params, vocab {meta['model_config']['vocab_size']}",
            f"  trained: {meta['tokens_trained']:,} tokens ({meta['epochs']:.2f} epochs) at "
            f"{meta['train_tokens_per_second']:.0f} tok/s, seed {meta['seed']}",
            f"  held-out loss: {meta['heldout_loss']:.4f} nats/token over {meta['heldout_tokens_scored']:,} tokens "
            f"({meta['files']['heldout_count']} files; {meta['files']['train_count']} train files)",
            "  seconds: " + ", ".join(f"{k[:-2]} {v:.1f}" for k, v in stages.items()),
        ]
    )


_SPEC_FLAGS = {
    "max_tokens": "training tokens",
    "num_layers": "decoder layers",
    "hidden_size": "hidden width",
    "num_heads": "attention heads",
    "intermediate_size": "MLP width (default: 8/3 of the hidden width, rounded up to a multiple of 64)",
    "num_threads": "torch threads while building",
}


def spec_from_args(args: argparse.Namespace) -> DemoTargetSpec:
    """The default spec with the fields given on the command line replaced (a new cache folder)."""
    changes = {name: getattr(args, name) for name in _SPEC_FLAGS if getattr(args, name, None) is not None}
    return dataclasses.replace(DemoTargetSpec(), **changes)


def main(argv: list[str] | None = None) -> None:
    """``python -m draftheads.demo``: build the demo target and print its summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="output folder (default: the cache folder for these settings)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a finished build exists")
    for name, help_text in _SPEC_FLAGS.items():
        default = getattr(DemoTargetSpec, name)
        suffix = "" if default is None else f" (default: {default:,})"
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=help_text + suffix)
    args = parser.parse_args(argv)
    spec = spec_from_args(args)
    target = pathlib.Path(args.out).expanduser() if args.out else default_target_dir(spec)
    folder = target if is_complete(target, spec) and not args.force else build_demo_target(target, spec)
    print(summary(folder))


if __name__ == "__main__":
    main()
