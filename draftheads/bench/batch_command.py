"""The `--batch-size` branch of `draftheads bench`: run `BatchBench`, write report.json/report.md."""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

from ..atomic import write_text_atomically
from .batch import BatchBench, batch_markdown
from .methods import PLAIN


def run_batch_sizes(args, target, tokenizer, methods, questions, source: str) -> int:
    from .environment import environment
    from .report import REPORT_JSON, REPORT_MD

    import json

    bench = BatchBench(target, tokenizer, methods, args.max_new_tokens, args.temperature, args.seed,
                       use_chat_template=not args.no_chat_template)
    rounds = getattr(args, "rounds", 1)
    table = bench.run(questions, args.batch_size, args.batches, args.warmup, progress=not args.no_progress,
                      rounds=rounds)
    names = [m.name for m in methods]
    planned = [m.name for m in methods if getattr(m.decoder, "batch_plan", None)]  # heads calibrated with --batch-sizes
    report = {
        "format_version": 1,
        "kind": "batch",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "draftheads " + " ".join(sys.argv[1:]) if sys.argv and "draftheads" in sys.argv[0] else None,
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "environment": environment(target),
        "questions": {"source": source, "questions": len(questions)},
        "methods": [m.describe() for m in methods],
        "batch": table,
    }
    exact = [table[s][n]["all_exact"] for s in table for n in names if table[s][n]["all_exact"] is not None]
    report["all_exact"] = all(exact) if exact else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=args.overwrite)
    md = (f"# draftheads bench, batched\n\n{source}; {args.max_new_tokens} new tokens, temperature {args.temperature}.\n"
          "Speedups are per-batch ratios of tokens/s to plain batched `generate` on the same batch "
          "(median [min-max] over batches), methods and plain interleaved. Decoding alone is the same ratio "
          "for the tokens after each row's first over the seconds after the prefill. "
          + (f"{rounds} timed rounds per batch (a batch's ratio: total tokens / total seconds over its rounds)."
             if rounds > 1 else "1 timed round per batch.")
          + (" A method with a batch plan shows the mode it ran in parentheses: (plain) is the target's own `generate`."
             if planned else "") + "\n\n" + batch_markdown(table, names, planned) + "\n")
    write_text_atomically(out / REPORT_JSON, json.dumps(report, indent=1, default=str) + "\n")
    write_text_atomically(out / REPORT_MD, md)
    print(batch_markdown(table, names, planned))
    print(f"\nwrote {out / REPORT_JSON}, {out / REPORT_MD}")
    if report["all_exact"] is False:
        print(f"warning: some batched outputs differ from plain {PLAIN} generate (see 'exact' in report.json)", file=sys.stderr)
    return 0
