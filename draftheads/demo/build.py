"""Building the demo target into its cache folder: atomically, under a lock, once per spec."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import sys
import time

import torch

from ..atomic import exclusive_lock, install_folder, recover, temp_folder
from .corpus import _relative, corpus_files, pack_documents, stdlib_root, train_tokenizer
from .pretrain import heldout_loss, make_model, pick_device, train_model
from .spec import DEMO_TARGET, METADATA_FILE, RECIPE_VERSION, DemoTargetSpec

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
    with exclusive_lock(target):  # concurrent builders: the second waits, then reuses
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
