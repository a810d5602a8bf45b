"""The files a benchmark leaves in its --out folder: ``<stem>.json`` (its arguments and report, what
`results.py --from-reports` reads back) and ``<stem>.md`` (the table the results page shows), both
written atomically so a killed run never leaves half a report; the table is printed too."""
from __future__ import annotations

import argparse
from pathlib import Path

from draftheads.atomic import write_json_atomically, write_text_atomically


def write_report(out: Path, args: argparse.Namespace, report: dict, text: str, stem: str = "results") -> None:
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomically(out / f"{stem}.json", {"args": vars(args), **report})
    write_text_atomically(out / f"{stem}.md", text)
    print(text)
