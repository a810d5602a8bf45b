"""Self-distillation data: the target writes the answers of a dataset, or of a prompt set.

Draft heads learn to predict what the target generates; trained on human-written answers they
learn text the target would not write. ``distill`` (re)generates a dataset with the target itself,
writing rows in the input's format (so ``data.path`` can point at the output):

* chat rows (ShareGPT ``conversations`` or OpenAI ``messages``): every assistant turn is replaced
  by the target's answer to the *regenerated* history so far (system and user turns kept
  verbatim). A row without any assistant turn (a prompt set) is answered turn by turn: an
  assistant turn goes after each user turn. A row that ends with a user turn after assistant
  turns gets that last turn answered too. A row without a user turn is skipped and counted, and
  so is a row where a turn's prompt plus ``max_new_tokens`` would not fit the target's context.
* prompt rows (``prompt``: a string, or ``turns``: a list of user turns, as MT-Bench writes
  them): answered like user-only chat rows; the output row gains a ``messages`` column.
* plain-text rows are continued from a prefix: the first ``prompt_tokens`` tokens of the text, but
  never more than half of them (so at least half of every row is the target's text); the output
  text is that prefix followed by the target's continuation. An empty row is skipped and counted.

The target's exact tokens are kept in ``_token_ids`` (see ``exact_ids``: decoded text does not
always tokenize back to them) and later turns' prompts are built from them, so a row is what the
target saw and wrote; ``answers_retokenized_differently`` counts the answers whose text alone
would have trained other tokens.

Temperatures: one value, or a list that rows take in turn (row ``i`` uses ``list[i % len]``; every
turn of a row the same), so one set mixes greedy and sampled answers; a mixed set records each
row's ``_temperature``.

Rows holding an evaluation question (``eval_overlap``) are refused by default (``drop`` leaves
them out, ``warn`` keeps them), so no benchmark prompt is ever answered into training data.

Output: one JSON line per kept input row, with the input's keys plus ``_row`` (its index in the
input, which training ignores). ``_row`` makes the run resumable: after a kill, rows already in
the output are skipped, a torn last line is cut off, and nothing is written twice. The settings
go to ``<out>.distill.json``; resuming with different settings is refused.

Reasoning models: ``reasoning="drop"`` removes ``<think>...</think>`` from each answer (and so from
the history of later turns); such answers keep no ``_token_ids`` (the ids would not match the text).
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
from typing import Any

from ..atomic import write_json_atomically
from .engines import DistillError, Engine, HFEngine, Result, Sampling, VLLMEngine, cut_at_eos, eos_ids
from .eval_overlap import Match, describe, first_match, texts_to_check
from .exact_ids import TOKEN_IDS, NotSpliceable, decode, retokenizes_exactly, spliced_chat
from .formats import Message, detect_format, normalize_chat

__all__ = [
    "DistillError", "DistillSettings", "DistillStats", "Distiller", "HFEngine", "VLLMEngine", "Sampling", "cut_at_eos",
    "distill", "eos_ids", "read_rows", "resume_state", "sidecar_path", "strip_reasoning",
]

ROW_KEY = "_row"
TEMPERATURE_KEY = "_temperature"
SIDECAR_SUFFIX = ".distill.json"
PROMPT_FORMAT = "prompts"
PROMPT_COLUMNS = ("prompt", "turns")
THINK = re.compile(r"<think>.*?(</think>\s*|$)", re.DOTALL)
# Settings that change the output: a resumed run must use the same ones.
_FIXED = (
    "target", "data", "format", "engine", "temperature", "top_p", "max_new_tokens", "prompt_tokens", "reasoning",
    "seed", "dtype", "synthesize", "prompt_temperature", "prompt_top_p", "prompt_max_tokens", "max_candidates", "eval_overlap",
)


@dataclass
class DistillSettings:
    target: str
    data: str
    out: str
    engine: str = "hf"
    temperature: float | Sequence[float] = 0.0  # a list: rows take its values in turn
    top_p: float = 1.0
    max_new_tokens: int = 1024
    batch_size: int = 8
    prompt_tokens: int = 64
    reasoning: str = "keep"
    seed: int = 0
    format: str = "auto"
    text_field: str = "text"
    eval_overlap: str = "refuse"
    dtype: str = "auto"  # the target's (recorded: it changes the answers)
    # --synthesize: the target writes N prompts first (see synthesize.py)
    synthesize: int = 0
    prompt_temperature: float = 1.0
    prompt_top_p: float = 0.95
    prompt_max_tokens: int = 256
    max_candidates: int = 0  # 0: 3 x synthesize

    def __post_init__(self) -> None:
        if self.engine not in ("hf", "vllm"):
            raise DistillError(f"--engine must be hf or vllm, got {self.engine!r}")
        if self.reasoning not in ("keep", "drop"):
            raise DistillError(f"--reasoning must be keep or drop, got {self.reasoning!r}")
        if self.eval_overlap not in ("refuse", "drop", "warn"):
            raise DistillError(f"--eval-overlap must be refuse, drop or warn, got {self.eval_overlap!r}")
        temps = [self.temperature] if isinstance(self.temperature, (int, float)) else list(self.temperature)
        if not temps or any(not isinstance(t, (int, float)) or t < 0 for t in temps):
            raise DistillError(f"--temperature must be one or more values >= 0, got {self.temperature!r}")
        self.temperature = float(temps[0]) if len(temps) == 1 else [float(t) for t in temps]
        if not 0 < self.top_p <= 1 or not 0 < self.prompt_top_p <= 1:
            raise DistillError(f"top-p must be in (0, 1], got {self.top_p} / {self.prompt_top_p}")
        if self.prompt_temperature <= 0:
            raise DistillError(f"--prompt-temperature must be > 0 (greedy would write one prompt), got {self.prompt_temperature}")
        for name in ("max_new_tokens", "batch_size", "prompt_tokens", "prompt_max_tokens"):
            if getattr(self, name) < 1:
                raise DistillError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.synthesize < 0 or self.max_candidates < 0:
            raise DistillError(f"--synthesize and --max-candidates must be >= 0, got {self.synthesize}, {self.max_candidates}")

    @property
    def temperatures(self) -> list[float]:
        return [self.temperature] if isinstance(self.temperature, float) else list(self.temperature)

    def sampling(self, row: int) -> Sampling:
        """How row ``row``'s answers are generated."""
        temps = self.temperatures
        return Sampling(temps[row % len(temps)], self.top_p, self.max_new_tokens)


@dataclass
class DistillStats:
    rows_read: int = 0
    rows_written: int = 0
    rows_resumed: int = 0  # already in the output when this run started
    rows_answered: int = 0  # rows (prompt sets) that got assistant turns appended
    skipped_no_user: int = 0  # chat rows without a user turn to answer
    skipped_empty: int = 0
    skipped_too_long: int = 0  # a prompt + max_new_tokens would not fit the target's context
    eval_overlap: int = 0  # rows holding an evaluation question, left out (--eval-overlap drop)
    turns_generated: int = 0
    turns_truncated: int = 0  # hit max_new_tokens before an end-of-sequence token
    answers_retokenized_differently: int = 0  # their text alone tokenizes to other ids (kept exact in _token_ids)
    rows_not_spliceable: int = 0  # the template gives no exact place for the ids: later prompts from text
    generated_tokens: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


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


def row_format(rows: Sequence[dict[str, Any]], settings: DistillSettings) -> str:
    """sharegpt | messages | text | prompts, from the columns (or ``settings.format``)."""
    columns = {k for r in rows for k in r}
    if settings.format == PROMPT_FORMAT or (
        settings.format == "auto" and columns.isdisjoint(("conversations", "messages", settings.text_field))
        and not columns.isdisjoint(PROMPT_COLUMNS)
    ):
        return PROMPT_FORMAT
    try:
        return detect_format(columns, settings.format, settings.text_field)
    except ValueError as err:
        raise DistillError(
            f"{settings.data}: {err}; or a prompt set: 'prompt' (a string) or 'turns' (a list of user turns)"
        ) from err


def prompt_messages(row: dict[str, Any], index: int) -> list[Message]:
    """The user turns of a prompt row (``prompt``: a string, or ``turns``: a list of strings)."""
    if "prompt" in row and row["prompt"] is not None:
        value, ok = row["prompt"], isinstance(row["prompt"], str)
        turns = [value] if ok else []
    else:
        value = turns = row.get("turns") or []
        ok = isinstance(turns, list) and all(isinstance(t, str) for t in turns)
    if not ok:
        raise DistillError(f"row {index}: 'prompt' must be a string and 'turns' a list of strings, got {value!r:.80}")
    return [{"role": "user", "content": t} for t in turns if t.strip()]


def strip_reasoning(text: str) -> str:
    """The answer without ``<think>...</think>`` (an unclosed one runs to the end)."""
    return THINK.sub("", text).strip()


def chat_column(fmt: str) -> tuple[str, str, str]:
    """(row key holding the messages, message key of the role, of the content) of a chat format."""
    return ("conversations", "from", "value") if fmt == "sharegpt" else ("messages", "role", "content")


def find_eval_overlap(rows: Sequence[dict[str, Any]], fmt: str, text_field: str) -> list[tuple[int, Match]]:
    """(row index, evaluation turn) for every row that holds an evaluation question: in a user turn
    (chat and prompt rows) or in the text (text rows)."""
    found = []
    for i, row in enumerate(rows):
        if fmt == PROMPT_FORMAT:
            texts = [m["content"] for m in prompt_messages(row, i)]
        else:
            texts = texts_to_check(row.get(text_field if fmt == "text" else chat_column(fmt)[0]), fmt, i)
        match = first_match(texts)
        if match is not None:
            found.append((i, match))
    return found


@dataclass
class _ChatJob:
    index: int
    row: dict[str, Any]
    messages: list[Message]  # normalised, assistant contents filled in as they are generated
    source: list[int | None]  # per message: its position in the input row, None for an added answer
    assistant_at: list[int]  # message positions of the assistant turns
    sampling: Sampling
    answers: list[list[int] | None] = field(default_factory=list)  # exact ids per assistant turn so far
    spliceable: bool = True


class Distiller:
    """Regenerates rows through an engine; the caller feeds it batches of (index, row)."""

    def __init__(self, engine: Engine, tokenizer: Any, settings: DistillSettings, fmt: str) -> None:
        self.engine, self.tokenizer, self.settings, self.fmt = engine, tokenizer, settings, fmt
        self.stats = DistillStats()
        if fmt != "text" and getattr(tokenizer, "chat_template", None) is None:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise DistillError(
                f"the data {settings.data!r} holds chat rows but the tokenizer {name!r} has no chat "
                "template, so prompts cannot be rendered; use the target's chat/instruct variant, add a "
                "chat_template to its tokenizer_config.json, or give plain-text rows (a 'text' column)"
            )

    def _decode(self, ids: list[int]) -> str:
        text = decode(self.tokenizer, ids)
        return strip_reasoning(text) if self.settings.reasoning == "drop" else text

    def _fits(self, prompt: list[int]) -> bool:
        limit = getattr(self.engine, "context_length", None)
        return limit is None or len(prompt) + self.settings.max_new_tokens <= limit

    def _count(self, results: list[Result]) -> None:
        for ids, finished in results:
            self.stats.turns_generated += 1
            self.stats.generated_tokens += len(ids)
            self.stats.turns_truncated += int(not finished)
            self.stats.answers_retokenized_differently += int(not retokenizes_exactly(self.tokenizer, ids))

    def batch(self, items: Sequence[tuple[int, dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
        """Regenerate a batch of rows; returns the output rows (skipped rows left out, counted)."""
        return self._text(items, seed) if self.fmt == "text" else self._chat(items, seed)

    def _job(self, index: int, row: dict[str, Any]) -> _ChatJob | None:
        """The conversation to generate for one row: its assistant turns, plus answers to user turns
        that have none (see the module docstring); None (counted) for a row with nothing to answer."""
        if self.fmt == PROMPT_FORMAT:
            given = prompt_messages(row, index)
        else:
            try:
                given = normalize_chat(row.get(chat_column(self.fmt)[0]), self.fmt, index)
            except ValueError as err:
                raise DistillError(f"{self.settings.data}: {err}") from err
        if not given:
            self.stats.skipped_empty += 1
            return None
        if not any(m["role"] == "user" for m in given):
            self.stats.skipped_no_user += 1
            return None
        has_answers = any(m["role"] == "assistant" for m in given)
        messages: list[Message] = []
        source: list[int | None] = []
        for pos, m in enumerate(given):
            messages.append(dict(m))
            source.append(None if self.fmt == PROMPT_FORMAT else pos)
            last = pos == len(given) - 1
            if m["role"] == "user" and (not has_answers or last):
                messages.append({"role": "assistant", "content": ""})
                source.append(None)
        if not has_answers:
            self.stats.rows_answered += 1
        at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        return _ChatJob(index, row, messages, source, at, self.settings.sampling(index))

    def _chat(self, items: Sequence[tuple[int, dict[str, Any]]], seed: int) -> list[dict[str, Any]]:
        jobs = [job for index, row in items if (job := self._job(index, row)) is not None]
        turn = 0
        while True:  # turn t of every row that has one, in one engine call
            live = [j for j in jobs if turn < len(j.assistant_at)]
            if not live:
                break
            prompts = [self._chat_prompt(j, turn) for j in live]
            too_long = {id(j) for j, p in zip(live, prompts) if not self._fits(p)}
            if too_long:  # the whole row is dropped: a half-regenerated conversation would mix sources
                self.stats.skipped_too_long += len(too_long)
                jobs = [j for j in jobs if id(j) not in too_long]
                prompts = [p for j, p in zip(live, prompts) if id(j) not in too_long]
                live = [j for j in live if id(j) not in too_long]
                if not live:
                    continue
            results = self.engine.generate(prompts, seed + turn, [j.sampling for j in live])
            self._count(results)
            for job, (ids, _) in zip(live, results):
                text = self._decode(ids)
                job.messages[job.assistant_at[turn]]["content"] = text
                job.answers.append(ids if text == decode(self.tokenizer, ids) else None)
            turn += 1
        return [self._output_row(job) for job in jobs]

    def _chat_prompt(self, job: _ChatJob, turn: int) -> list[int]:
        """The prompt of ``turn``: the history with the earlier answers' exact ids (when the template
        allows it), rendered with the generation prompt."""
        history = job.messages[: job.assistant_at[turn]]
        if job.spliceable:
            try:
                return spliced_chat(self.tokenizer, history, job.answers[:turn], add_generation_prompt=True, row=job.index)[0]
            except NotSpliceable:
                job.spliceable = False
                self.stats.rows_not_spliceable += 1
        text = self.tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])  # the template writes bos

    def _output_row(self, job: _ChatJob) -> dict[str, Any]:
        row = copy.deepcopy(job.row)
        fmt = "messages" if self.fmt == PROMPT_FORMAT else self.fmt
        key, role_key, content_key = chat_column(fmt)
        given = row.get(key) or []
        out = []
        for msg, pos in zip(job.messages, job.source):
            if pos is not None:
                entry = given[pos]
                if msg["role"] == "assistant":
                    entry[content_key] = msg["content"]
            else:
                role = msg["role"] if fmt == "messages" or msg["role"] != "assistant" else "gpt"
                role = "human" if fmt == "sharegpt" and role == "user" else role
                entry = {role_key: role, content_key: msg["content"]}
            out.append(entry)
        row[key] = out
        if any(a is not None for a in job.answers):  # (None: an answer whose text was changed, --reasoning drop)
            row[TOKEN_IDS] = job.answers
        if len(self.settings.temperatures) > 1:
            row[TEMPERATURE_KEY] = job.sampling.temperature
        row[ROW_KEY] = job.index
        return row

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
        results = self.engine.generate(prompts, seed, [self.settings.sampling(index) for index, _, _ in jobs])
        self._count(results)
        out = []
        for (index, row, prefix), (ids, _) in zip(jobs, results):
            new = dict(row)
            new[field_name] = decode(self.tokenizer, prefix + ids)
            new[TOKEN_IDS] = prefix + ids
            if len(self.settings.temperatures) > 1:
                new[TEMPERATURE_KEY] = self.settings.sampling(index).temperature
            new[ROW_KEY] = index
            out.append(new)
        return out


# ---------------------------------------------------------------------------------------------
# Output: resumable jsonl + sidecar
# ---------------------------------------------------------------------------------------------


def sidecar_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + SIDECAR_SUFFIX)


def _same(key: str, before: Any, now: Any) -> bool:
    if key == "temperature":  # one value was a float, a mix a list
        as_list = lambda v: [float(x) for x in v] if isinstance(v, list) else [float(v)]
        return as_list(before) == as_list(now)
    return before == now


def check_settings(out: Path, settings: DistillSettings) -> None:
    """Refuse to continue ``out`` with settings that change the output."""
    side = sidecar_path(out)
    if not side.exists():
        return
    before = json.loads(side.read_text()).get("settings", {})
    now = asdict(settings)
    diff = [f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in _FIXED if k in before and not _same(k, before[k], now[k])]
    if diff:
        raise DistillError(
            f"{out} was written with other settings ({'; '.join(diff)}); resume with the same "
            "settings or choose another --out"
        )


def resume_state(out: Path, settings: DistillSettings, resume: bool, *, started: bool | None = None) -> set[int]:
    """Input rows already in ``out`` (after cutting a torn last line); refuses to overwrite or to
    resume with other settings. ``started``: whether an earlier run began writing (default: ``out``
    exists; ``--synthesize`` also counts its prompt file)."""
    started = out.exists() if started is None else started
    if not started:
        return set()
    if not resume:
        raise DistillError(f"{out} exists; pass --resume to continue it or choose another --out")
    check_settings(out, settings)
    if not out.exists():
        return set()
    return set(read_resumable(out, ROW_KEY, f"is --out the right file? ({out})"))


def read_resumable(path: Path, key: str, hint: str) -> list[int]:
    """The ``key`` of every complete line of a jsonl file written line by line; a torn last line
    (a kill mid-write) is cut off the file."""
    data = path.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut < len(data):  # the last line was torn by a kill: drop it, it is regenerated
        with path.open("r+b") as f:
            f.truncate(cut)
    done: list[int] = []
    for n, line in enumerate(data[:cut].decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            done.append(int(json.loads(line)[key]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise DistillError(f"{path}:{n} is not a distill row with {key!r} ({err}); {hint}") from err
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
    stats: DistillStats | None = None,
) -> DistillStats:
    """Regenerate ``settings.data`` (or ``rows``) into ``settings.out`` (see the module docstring)."""
    from tqdm.auto import tqdm

    rows = read_rows(settings.data, settings.text_field) if rows is None else rows
    if not rows:
        raise DistillError(f"the data {settings.data!r} has 0 rows")
    fmt = row_format(rows, settings)
    skip = check_eval_overlap(rows, fmt, settings)
    out = Path(settings.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = resume_state(out, settings, resume)
    distiller = Distiller(engine, tokenizer, settings, fmt)
    if stats is not None:
        distiller.stats = stats
    stats = distiller.stats
    stats.rows_read, stats.rows_resumed = len(rows), len(done)
    stats.eval_overlap = len(skip)
    todo = [(i, r) for i, r in enumerate(rows) if i not in done and i not in skip]
    if resume and done:
        print(f"resuming: {len(done)} rows already in {out}, {len(todo)} to go")
    write_sidecar(out, settings, stats, complete=False)
    bar = tqdm(total=len(todo), desc="distill", unit="row", disable=not progress, dynamic_ncols=True)
    start = time.perf_counter()
    seconds_before = stats.seconds
    with out.open("a") as f:
        for chunk in batches(todo, settings.batch_size):
            written = distiller.batch(chunk, settings.seed + chunk[0][0])
            for row in written:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            stats.rows_written += len(written)
            stats.seconds = seconds_before + time.perf_counter() - start
            bar.update(len(chunk))
            bar.set_postfix(tok_s=f"{stats.generated_tokens / max(stats.seconds - seconds_before, 1e-9):.1f}")
            write_sidecar(out, settings, stats, complete=False)
    bar.close()
    stats.seconds = seconds_before + time.perf_counter() - start
    write_sidecar(out, settings, stats, complete=True)
    return stats


def check_eval_overlap(rows: Sequence[dict[str, Any]], fmt: str, settings: DistillSettings, *, quiet: bool = False) -> set[int]:
    """Rows to leave out for holding an evaluation question; refuses them under ``refuse``."""
    try:
        found = find_eval_overlap(rows, fmt, settings.text_field)
    except ValueError as err:  # a malformed chat row, named by normalize_chat
        raise DistillError(f"{settings.data}: {err}") from err
    if not found:
        return set()
    what = describe(found, len(rows))
    if settings.eval_overlap == "refuse":
        raise DistillError(
            f"{settings.data}: {what}; heads trained on them would be measured on their training data. Remove "
            "those rows, or pass --eval-overlap drop (leave them out) or --eval-overlap warn (keep them)"
        )
    if not quiet:
        print(f"warning: {what}; " + ("left out (--eval-overlap drop)" if settings.eval_overlap == "drop"
                                      else "kept (--eval-overlap warn): do not benchmark on them"))
    return {i for i, _ in found} if settings.eval_overlap == "drop" else set()
