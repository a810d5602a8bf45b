"""The demo corpus rewritten by the demo target itself: ``data.path: demo-distilled``.

Heads learn to predict the target, so they are best trained on text the target writes: that is
where they will be used, and it is what the EAGLE and Medusa-2 authors do (regenerate the data with
the target). On the demo target it matters more than usual: its greedy continuations fall into
short loops (``#\\n#\\n...``) that the stdlib files never contain, and heads trained on the files
alone meet those hidden states for the first time while decoding. Trained on this set, EAGLE and
EAGLE-3 heads follow the loops, and EAGLE-3 overtakes EAGLE at equal training wall time (measured:
"EAGLE vs EAGLE-3 at equal training wall time" in `git show 19f3628:benchmarks/README.md`).

The set: the first ``files`` training files of the corpus (seeded shuffle), cut into chunks of
``chunk_tokens`` tokens; the target continues each chunk's first ``prompt_tokens`` tokens for
``new_tokens`` more, greedily for one half of the chunks and sampled at T = 1 for the other (both
the states decoding meets: greedy loops and varied text). Built with ``draftheads distill``'s own
code on first use (a few minutes on 2 CPU cores), cached beside the demo target and keyed by it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import random
import shutil

from ..atomic import exclusive_lock, temp_folder, write_text_atomically
from .config import DataConfig

DEMO_DISTILLED = "demo-distilled"


@dataclasses.dataclass(frozen=True)
class DistilledSpec:
    """What the distilled set is made of; its hash names the cached file."""

    files: int = 200
    chunk_tokens: int = 320
    prompt_tokens: int = 64
    new_tokens: int = 192
    sampled_temperature: float = 1.0
    batch_size: int = 64
    seed: int = 0

    def key(self) -> str:
        return hashlib.sha1(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def distilled_path(target_dir: pathlib.Path, spec: DistilledSpec) -> pathlib.Path:
    """The cached set for the demo target in ``target_dir``: a jsonl beside that folder."""
    return target_dir.parent / f"{target_dir.name}-distilled-{spec.key()}.jsonl"


def corpus_chunks(tokenizer, spec: DistilledSpec) -> list[str]:
    """The chunks to continue: training files only (held-out files stay unseen), seeded order.

    A file's first chunk keeps the BOS its tokenization starts with, as in the target's pretraining.
    """
    from ..demo import corpus_texts  # (the demo package pulls in model-building code: imported on use)

    texts = list(corpus_texts("train"))
    random.Random(spec.seed).shuffle(texts)
    chunks = []
    for text in texts[: spec.files]:
        ids = tokenizer(text, verbose=False).input_ids  # (whole files: longer than the context, on purpose)
        # a tail shorter than half a chunk is dropped: too little left after the prompt to continue
        for start in range(0, len(ids) - spec.chunk_tokens // 2, spec.chunk_tokens):
            chunks.append(tokenizer.decode(ids[start : start + spec.chunk_tokens]))
    random.Random(spec.seed + 1).shuffle(chunks)
    return chunks


def build_distilled(target_dir: pathlib.Path, spec: DistilledSpec, out: pathlib.Path, progress: bool = True) -> int:
    """Distil the chunks with the target in ``target_dir`` into ``out``; returns the rows written."""
    from ..target import load_target
    from .distill import DistillSettings, HFEngine, distill

    model, tokenizer = load_target(str(target_dir))
    chunks = corpus_chunks(tokenizer, spec)
    half = len(chunks) // 2
    texts: list[str] = []
    tmp = temp_folder(out)  # also removes what a killed build left
    try:
        for name, part, temperature in (("greedy", chunks[:half], 0.0), ("sampled", chunks[half:], spec.sampled_temperature)):
            settings = DistillSettings(
                target=str(target_dir), data=f"{DEMO_DISTILLED}:{name}", out=str(tmp / f"{name}.jsonl"),
                temperature=temperature, max_new_tokens=spec.new_tokens, batch_size=spec.batch_size,
                prompt_tokens=spec.prompt_tokens, seed=spec.seed,
            )
            distill(settings, HFEngine(model, tokenizer, settings), tokenizer, progress=progress,
                    rows=[{"text": chunk} for chunk in part])
            with open(settings.out) as f:
                texts += [json.loads(line)["text"] for line in f]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    random.Random(spec.seed).shuffle(texts)  # greedy and sampled rows mixed in every batch
    write_text_atomically(out, "".join(json.dumps({"text": text}) + "\n" for text in texts))
    return len(texts)


def ensure_distilled(spec: DistilledSpec | None = None, target_dir: str | os.PathLike | None = None,
                     progress: bool = True) -> pathlib.Path:
    """The cached distilled set (built first when missing) for the demo target, or the one in ``target_dir``."""
    from ..demo import ensure_demo_target

    spec = spec or DistilledSpec()
    target = pathlib.Path(target_dir) if target_dir is not None else ensure_demo_target(progress=progress)
    out = distilled_path(target.absolute(), spec)
    if out.is_file():
        return out
    with exclusive_lock(out):  # a second process waits for the first build, then reuses it
        if not out.is_file():
            if progress:
                print(f"building {DEMO_DISTILLED}: the demo target continues {spec.files} corpus files' chunks "
                      f"(once; cached at {out})", flush=True)
            build_distilled(target, spec, out, progress)
    return out


def resolve_data_path(cfg: DataConfig) -> DataConfig:
    """``cfg`` with ``demo-distilled`` replaced by the cached file (built first when missing).

    The set has one split: its rows are all training rows, so evaluating needs another source.
    """
    if DEMO_DISTILLED not in (cfg.path, cfg.eval_path):
        return cfg
    if cfg.path == DEMO_DISTILLED and cfg.eval_path is None and cfg.eval_split is not None:
        raise ValueError(
            f"data.path: {DEMO_DISTILLED} has one split (the target's continuations of training files), so "
            f"data.eval_split={cfg.eval_split!r} would evaluate on training rows; evaluate on held-out files "
            "with data.eval_path: demo and data.eval_split: heldout"
        )
    path = str(ensure_distilled())
    return dataclasses.replace(cfg, path=path if cfg.path == DEMO_DISTILLED else cfg.path,
                               eval_path=path if cfg.eval_path == DEMO_DISTILLED else cfg.eval_path)
