"""`draftheads bench`: the command line around questions -> methods -> runner -> metrics -> report.

Everything a user can get wrong (question file, categories, method names, output folder) is
checked before the target is loaded, so a typo costs a second, not a model load.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path
from typing import Callable

from ..arguments import batch_sizes, positive_int
from ..data.prompt_sets import DEFAULT_QUESTIONS, describe_names


def _csv(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return items


def add_parser(sub, add_target_args: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench",
        help="measure speedup, accepted tokens and exactness of methods vs plain generate",
        description="Spec-Bench-style benchmark: plain `generate` and each method, interleaved on the same prompts.",
    )
    add_target_args(p)
    p.add_argument("--heads", action="append", default=[], metavar="DIR",
                   help="heads folder (repeatable: the method is named after its head_type, e.g. medusa, eagle)")
    p.add_argument("--draft-model", metavar="PATH_OR_ID", help="a small LM with the target's tokenizer (method draft-model)")
    p.add_argument("--prompt-lookup", action="store_true", help="add prompt-lookup drafting (method prompt-lookup)")
    p.add_argument("--compare", type=_csv, default=None, metavar="A,B,...",
                   help="methods to run, in order (default: every one configured by --heads/--draft-model/--prompt-lookup; "
                        "NAME+lookup, e.g. eagle3+lookup: those heads behind prompt lookup; NAME-lookup: the heads alone; "
                        "any method with @block after it, e.g. prompt-lookup@block: chains verified by block "
                        "verification, lossless like the default)")
    p.add_argument("--questions", default=DEFAULT_QUESTIONS, metavar="NAME_OR_FILE",
                   help=f"a set shipped in the package ({describe_names()}), a Spec-Bench .jsonl (question_id, "
                        f"category, turns) or a text file with one prompt per line (default: {DEFAULT_QUESTIONS}, "
                        "MT-Bench's 80 two-turn questions)")
    p.add_argument("--categories", type=_csv, default=None, metavar="A,B",
                   help="only these categories (spec-bench: translation, summarization, qa, math_reasoning, rag and "
                        "MT-Bench's eight)")
    p.add_argument("--max-questions", type=int, default=None, metavar="N",
                   help="at most N questions, round-robin over categories (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy, where exactness is checked")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-k-drafts", action="store_true",
                   help="at temperature > 0, heads draft their top-k trees instead of drawing chains from their own "
                        "distribution (the default)")
    p.add_argument("--warmup", type=int, default=1, metavar="N", help="untimed runs of every method before timing")
    p.add_argument("--rounds", type=positive_int, default=1, metavar="N",
                   help="time every prompt (or batch) N times per method, each round interleaved with plain and, "
                        "at temperature > 0, with its own seed; a prompt's speedup is total tokens over total "
                        "seconds across its rounds, against plain's (report.json per_question: per-round spread)")
    p.add_argument("--out", default="results", help="output folder for report.json, report.md and plots")
    p.add_argument("--overwrite", action="store_true", help="write into --out even if it exists")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch CPU threads (default: torch's choice; fewer than cores is steadier on a shared machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--batch-size", type=batch_sizes, default=None, metavar="1,4,8",
                   help="decode left-padded batches of these sizes: tokens/s of every method vs plain batched "
                        "generate at the same batch size (report.json 'batch', report.md table)")
    p.add_argument("--batches", type=int, default=None, metavar="N",
                   help="with --batch-size: N timed batches per size (default: as many as the prompts fill)")
    return p


def run_bench(args, load_model: Callable[[str], tuple]) -> int:
    """``load_model(path)`` -> (model, tokenizer), on the device and dtype the flags chose."""
    from .methods import MethodError
    from .questions import QuestionFileError
    from .runner import ChatTemplateError

    try:
        return _run(args, load_model)
    except (QuestionFileError, MethodError, ChatTemplateError) as e:
        raise SystemExit(f"error: {e}") from None


def _check_args(args) -> None:
    if args.max_new_tokens < 1:
        raise SystemExit(f"error: --max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.max_questions is not None and args.max_questions < 1:
        raise SystemExit(f"error: --max-questions must be >= 1, got {args.max_questions}")
    if args.threads is not None and args.threads < 1:
        raise SystemExit(f"error: --threads must be >= 1, got {args.threads}")
    if getattr(args, "batches", None) is not None and args.batches < 1:
        raise SystemExit(f"error: --batches must be >= 1, got {args.batches}")
    if args.warmup < 0:
        raise SystemExit(f"error: --warmup must be >= 0, got {args.warmup}")
    if args.temperature < 0:
        raise SystemExit(f"error: --temperature must be >= 0, got {args.temperature}")
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise SystemExit(f"error: output folder {out} already exists: pass --overwrite to replace its report, or choose another --out")
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --out {out} is a file, not a folder")


def _run(args, load_model) -> int:
    # Imported here, not at the top: building the CLI parser must not import torch.
    from .methods import build_methods, heads_method_names, resolve_compare
    from .metrics import OVERALL, summarize
    from .questions import categories, load_questions, select
    from .runner import Runner, Settings

    _check_args(args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    source = str(args.questions or DEFAULT_QUESTIONS)
    questions = select(load_questions(source), args.categories, args.max_questions)
    heads_names = heads_method_names(args.heads)
    names = resolve_compare(args.compare, heads_names, args.draft_model, args.prompt_lookup)

    target, tokenizer = load_model(args.target)
    methods = build_methods(names, target, tokenizer, args.heads, heads_names, args.draft_model, load_model,
                            check_fingerprint=not getattr(args, "no_fingerprint_check", False),
                            draw_drafts=not getattr(args, "top_k_drafts", False))
    if getattr(args, "batch_size", None):
        from .batch_command import run_batch_sizes

        return run_batch_sizes(args, target, tokenizer, methods, questions, source)
    settings = Settings(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, warmup=args.warmup,
        use_chat_template=not args.no_chat_template, progress=not args.no_progress,
        rounds=getattr(args, "rounds", 1),
    )
    samples = Runner(target, tokenizer, methods, settings).run(questions)

    cats = categories(questions)
    results = summarize(samples, [m.name for m in methods], cats)
    report = _report(args, settings, target, methods, questions, samples, source, cats, results)
    _write(Path(args.out), report, args, [m.name for m in methods], source, cats)
    for m in methods:
        if results[m.name]["by_category"][OVERALL]["speedup"] is None:
            print(f"warning: no timing for {m.name}", file=sys.stderr)
    return 0


def _report(args, settings, target, methods, questions, samples, source: str, cats, results) -> dict:
    """report.json's content: what ran (command, environment, settings, questions, methods) and
    what it measured (per-method results, exactness, every sample)."""
    from .environment import environment

    exact = [s.exact for s in samples if s.method != "plain" and s.exact is not None]
    return {
        "format_version": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "draftheads " + " ".join(sys.argv[1:]) if sys.argv and "draftheads" in sys.argv[0] else None,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "environment": environment(target),
        "settings": vars(settings),
        "questions": {
            "source": source,
            "questions": len(questions),
            "samples": sum(len(q.turns) for q in questions),
            "categories": cats,
            "truncated": sum(1 for s in samples if s.method == "plain" and s.round == 0 and s.truncated),
        },
        "methods": [m.describe() for m in methods],
        "results": results,
        "all_exact": all(exact) if exact else None,
        "samples": [s.to_dict() for s in samples],
        "plots": [],
    }


def _write(out: Path, report: dict, args, names: list[str], source: str, cats) -> None:
    """Write the report and its plots into ``out`` (an earlier run's files there removed first),
    then print its summary."""
    from . import plots
    from .report import REPORT_JSON, REPORT_MD, markdown, write_report

    out.mkdir(parents=True, exist_ok=args.overwrite)
    for stale in (REPORT_JSON, REPORT_MD, plots.SPEEDUP_PNG, plots.ACCEPT_PNG, plots.DEPTH_PNG):
        (out / stale).unlink(missing_ok=True)  # never leave an earlier run's plot beside this report
    try:
        title = f"{Path(str(report['environment']['target'])).name}, {Path(source).name}, {args.max_new_tokens} new tokens"
        report["plots"] = plots.write_plots(out, report["results"], names, cats, title)
    except ImportError:
        report["plots_missing"] = 'matplotlib is not installed: pip install "draftheads[bench]"'
    write_report(out, report)
    print(markdown(report).split("## Methods")[0].rstrip())
    print(f"\nwrote {out / REPORT_JSON}, {out / REPORT_MD}" + "".join(f", {out / p}" for p in report["plots"]))
    if report["all_exact"] is False:
        print("warning: some outputs differ from plain greedy generate (see 'exact' in report.json)", file=sys.stderr)
