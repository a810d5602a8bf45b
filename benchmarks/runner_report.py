"""What the scripts that time decoders through `draftheads bench`'s own `Runner` share once the run
is done (lookup_min_ngram.py, hybrid_budget.py, block_verification.py): the exactness check, the
speedup cells of their tables, and the two files they leave in ``--out``, written atomically
(`results.py` includes ``results.md`` in the page, so a kill must never leave half of one).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from draftheads.atomic import write_json_atomically, write_text_atomically


def require_exact(samples) -> None:
    """Refuse a run where any greedy output differed from plain ``generate`` (``exact is False``;
    None, at temperature > 0, is not checked)."""
    wrong = [s for s in samples if s.exact is False]
    if wrong:
        raise AssertionError(f"{wrong[0].method}: question {wrong[0].question_id} turn {wrong[0].turn} differs from generate")


def speedup_cells(overall: dict[str, Any]) -> str:
    """Two table cells from a `summarize` group: the speedup as bench computes it, then the
    per-sample median (min-max)."""
    spread = overall["per_sample_speedup"]
    return f"{overall['speedup']:.2f}x | {spread['median']:.2f}x ({spread['min']:.2f}-{spread['max']:.2f})"


def write_report(out: str | None, args: Any, samples: list[dict[str, Any]], header: str, table: str) -> None:
    """``out``/results.json (the arguments and every sample) and ``out``/results.md (``header``,
    then ``table``); nothing without ``out``."""
    if not out:
        return
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomically(folder / "results.json", {"args": vars(args), "samples": samples})
    write_text_atomically(folder / "results.md", header + "\n\n" + table)
