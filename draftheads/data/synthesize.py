"""``distill --synthesize N``: training data written entirely by the target, prompts included.

A user with a chat model and no dataset still has the model. An aligned chat model, given only its
chat template up to where a user message begins, writes a plausible user message (Magpie, Xu et
al. 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing").
So:

1. The prefix is found for any template: render one user message holding a sentinel and cut the
   text where the sentinel starts (for SmolLM2 that is its default system turn followed by
   ``<|im_start|>user\\n``). A tokenizer without a chat template is refused by name.
2. Candidates are sampled from that prefix (``prompt_temperature`` 1.0, ``prompt_top_p`` 0.95,
   stopping at the end of the turn), in batches of ``batch_size``, until ``N`` distinct prompts are
   kept or ``max_candidates`` (default 3N) were drawn. A candidate is dropped, and counted, when it
   is empty, when it ran into ``prompt_max_tokens`` without ending its turn (usually a loop), when
   it repeats a kept prompt (same normalised text: case, spacing and punctuation ignored), or when
   it is an evaluation question. A set that collapses into duplicates says so, with the counts.
3. The kept prompts are answered like any prompt set (``distill``): mixed temperatures, exact ids.

A base model (no chat template, e.g. Gemma-3-270M) has no user turn to write, but it writes text:
candidates are drawn from its BOS token alone (a candidate that reaches ``prompt_max_tokens`` is
kept, as text has no turn to end), and each kept text becomes a plain-text row that ``distill``
continues from its first ``prompt_tokens`` tokens: raw text the target wrote and then continued
itself, never evaluation text (overlaps are dropped as for chat prompts).

Resumable after a kill, nothing lost or repeated: each candidate batch is one line of
``<out>.prompts.jsonl`` (a torn last line is a lost batch, drawn again with the same seed), the
kept set is replayed from that file, and answers resume by ``_row`` (the prompt's index) as any
distill does. Batch ``b`` is seeded from ``seed + (first candidate index)`` (vLLM seeds each
candidate on its own), so a rerun with the same settings draws the same candidates.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .distill import DistillError, DistillSettings, DistillStats, distill, read_resumable, write_sidecar
from .engines import Engine, Sampling
from .eval_overlap import eval_index, normalize

SENTINEL = "DRAFTHEADS_USER_MESSAGE_7f3a9c"
PROMPTS_SUFFIX = ".prompts.jsonl"


def prompts_path(out: str | Path) -> Path:
    out = Path(out)
    return out.with_name(out.name + PROMPTS_SUFFIX)


def is_base_model(tokenizer: Any) -> bool:
    """A tokenizer without a chat template: its model continues text (the base-model path)."""
    return getattr(tokenizer, "chat_template", None) is None


def draw_prefix(tokenizer: Any) -> list[int]:
    """The token ids candidates are drawn from: the start of a user turn for a chat model, the BOS
    token alone for a base model (refused by name when it has none)."""
    if not is_base_model(tokenizer):
        return list(tokenizer(user_turn_prefix(tokenizer), add_special_tokens=False)["input_ids"])
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DistillError(f"--synthesize: {name!r} has no chat template and no BOS token, so there is nothing to draw "
                           "text from; give prompts or text with --data")
    return [int(bos)]


def user_turn_prefix(tokenizer: Any) -> str:
    """The chat template's text up to where a user message's content begins."""
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if getattr(tokenizer, "chat_template", None) is None:
        raise DistillError(
            f"--synthesize needs a chat model: the tokenizer of {name!r} has no chat template, so there is no "
            "user turn for the model to write. Use the chat/instruct variant of the model, or give prompts "
            "with --data"
        )
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False, add_generation_prompt=False)
    cut = text.find(SENTINEL) if isinstance(text, str) else -1
    if cut < 0:
        raise DistillError(
            f"--synthesize: the chat template of {name!r} does not copy a user message into its text, so the "
            "start of a user turn cannot be found; give prompts with --data instead"
        )
    return text[:cut]


@dataclass
class PromptStats:
    asked: int = 0
    candidates: int = 0
    kept: int = 0  # distinct prompts answered (at most ``asked``)
    unused: int = 0  # distinct prompts the last batch drew beyond ``asked``
    duplicates: int = 0
    empty: int = 0
    truncated: int = 0  # ran into prompt_max_tokens without ending the turn
    eval_overlap: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        share = self.duplicates / max(self.candidates, 1)
        return (
            f"prompts: {self.kept} kept of {self.candidates} drawn ({self.duplicates} duplicates = {share:.0%}, "
            f"{self.empty} empty, {self.truncated} cut at --prompt-max-tokens, {self.eval_overlap} evaluation "
            f"questions, {self.unused} more than asked); {self.tokens} tokens in {self.seconds:.1f}s"
        )


class PromptSet:
    """The kept prompts, replayed candidate by candidate (the same order gives the same set)."""

    def __init__(self, asked: int) -> None:
        self.stats = PromptStats(asked=asked)
        self.kept: list[str] = []
        self.seen: set[str] = set()
        self.index = eval_index()

    def add(self, text: str, finished: bool, tokens: int) -> None:
        s = self.stats
        s.candidates += 1
        s.tokens += tokens
        key = normalize(text)
        if not key:
            s.empty += 1
        elif not finished:
            s.truncated += 1
        elif key in self.seen:
            s.duplicates += 1
        elif self.index.find(text) is not None:
            s.eval_overlap += 1
        else:
            self.seen.add(key)
            self.kept.append(text.strip())
        s.kept, s.unused = min(len(self.kept), s.asked), max(0, len(self.kept) - s.asked)


def read_candidates(path: Path, prompts: PromptSet) -> None:
    """Replay the candidate batches already drawn (cutting a batch torn by a kill)."""
    if not path.exists():
        return
    read_resumable(path, "_batch", f"is it a --synthesize prompt file? ({path})")  # cuts a torn last line
    for line in path.read_text().splitlines():
        if line.strip():
            batch = json.loads(line)
            if batch["_batch"] != prompts.stats.candidates:
                raise DistillError(f"{path}: batch {batch['_batch']} follows {prompts.stats.candidates} candidates; the file was edited")
            for c in batch["candidates"]:
                prompts.add(c["text"], c["finished"], c["tokens"])
    prompts.stats.seconds = 0.0


def synthesize_prompts(
    settings: DistillSettings, engine: Engine, tokenizer: Any, *, progress: bool = True
) -> tuple[list[str], PromptStats]:
    """Stage 1 (see the module docstring): the kept prompts, at most ``settings.synthesize``."""
    from tqdm.auto import tqdm

    want = settings.synthesize
    cap = settings.max_candidates or 3 * want
    path = prompts_path(settings.out)
    prompts = PromptSet(want)
    read_candidates(path, prompts)
    stats = prompts.stats
    seconds_before = _seconds_so_far(settings)
    prefix = draw_prefix(tokenizer)
    text_rows = is_base_model(tokenizer)  # raw text: a draw that reaches the limit is kept
    sampling = Sampling(settings.prompt_temperature, settings.prompt_top_p, settings.prompt_max_tokens)
    if stats.candidates and stats.kept < want and stats.candidates < cap:
        print(f"resuming the prompts: {stats.kept} kept of {stats.candidates} drawn", flush=True)
    bar = tqdm(total=want, initial=min(stats.kept, want), desc="prompts", unit="prompt", disable=not progress,
               dynamic_ncols=True)
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        while stats.kept < want and stats.candidates < cap:
            first = stats.candidates
            size = min(settings.batch_size, cap - first)
            results = engine.generate([prefix] * size, settings.seed + first, [sampling] * size)
            batch = [{"text": tokenizer.decode(ids, skip_special_tokens=True), "finished": done or text_rows,
                      "tokens": len(ids)} for ids, done in results]
            f.write(json.dumps({"_batch": first, "candidates": batch}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            before = stats.kept
            for c in batch:
                prompts.add(c["text"], c["finished"], c["tokens"])
            stats.seconds = seconds_before + time.perf_counter() - start
            bar.update(min(stats.kept, want) - min(before, want))
            bar.set_postfix(drawn=stats.candidates, dup=stats.duplicates)
            write_sidecar(Path(settings.out), settings, DistillStats(extra={"prompts": asdict(stats)}), complete=False)
    bar.close()
    stats.seconds = seconds_before + time.perf_counter() - start
    if stats.kept == 0:
        raise DistillError(
            f"--synthesize: the target wrote no usable prompt in {stats.candidates} tries ({stats.summary()}); "
            "check that the target is a chat model, raise --prompt-temperature or --prompt-max-tokens"
        )
    return prompts.kept[:want], stats


def _seconds_so_far(settings: DistillSettings) -> float:
    from .distill import sidecar_path

    side = sidecar_path(settings.out)
    if not side.exists():
        return 0.0
    return float(json.loads(side.read_text()).get("stats", {}).get("extra", {}).get("prompts", {}).get("seconds", 0.0))


def collapse_note(stats: PromptStats) -> str | None:
    """What to tell the user when the prompts fell short or were mostly repeats."""
    if stats.kept < stats.asked:
        return (
            f"the prompts collapse: only {stats.kept} distinct prompts of the {stats.asked} asked after "
            f"{stats.candidates} draws ({stats.duplicates} duplicates, {stats.empty} empty, {stats.truncated} cut "
            "off); the target keeps writing the same questions. Raise --prompt-temperature or --max-candidates, or "
            "ask fewer; answering the ones kept"
        )
    if stats.duplicates > stats.candidates // 4:
        return (
            f"{stats.duplicates} of {stats.candidates} drawn prompts ({stats.duplicates / stats.candidates:.0%}) repeated "
            "earlier ones: a larger set will mostly repeat itself"
        )
    return None


def synthesize(
    settings: DistillSettings, engine: Engine, tokenizer: Any, *, resume: bool = False, progress: bool = True
) -> DistillStats:
    """Prompts written by the target, then its answers, into ``settings.out`` (module docstring)."""
    if settings.synthesize < 1:
        raise DistillError(f"--synthesize must be >= 1, got {settings.synthesize}")
    out = Path(settings.out)
    started = out.exists() or prompts_path(out).exists()
    if started and not resume:
        raise DistillError(f"{out} (or its prompt file) exists; pass --resume to continue it or choose another --out")
    from .distill import check_settings

    check_settings(out, settings)
    prompts, prompt_stats = synthesize_prompts(settings, engine, tokenizer, progress=progress)
    print(prompt_stats.summary(), flush=True)
    note = collapse_note(prompt_stats)
    if note:
        print(f"warning: {note}", flush=True)
    if is_base_model(tokenizer):  # raw text the target wrote, continued from its first --prompt-tokens tokens
        rows = [{"text": p} for p in prompts]
    else:
        rows = [{"messages": [{"role": "user", "content": p}]} for p in prompts]
    stats = DistillStats(extra={"prompts": asdict(prompt_stats)})
    return distill(settings, engine, tokenizer, resume=resume, progress=progress, rows=rows, stats=stats)
