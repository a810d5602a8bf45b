"""Batched EAGLE drafting: one forked proposer per row vs `EagleRows` (one draft forward per depth
for all rows), and EagleRows' draft-cache compaction policies, side by side.

Every mode decodes the same left-padded batches (prompts of 64..128 tokens, so rows are padded
differently), interleaved round by round; the figure is each mode's tokens/s relative to
"forked" on the same batch, median and spread over batches and rounds (`batch_ab.py`). Outputs AND per-row
accept lengths are checked equal across modes (the same trees are drafted).

    python benchmarks/bench_eagle_rows.py --heads runs/demo-eagle/heads --batch-sizes 4,8
"""
from __future__ import annotations

import argparse

from batch_ab import add_arguments, compare
from draftheads.inference.proposers.eagle import EagleProposer
from draftheads.inference.proposers.eagle_rows import EagleRows
from draftheads.inference.proposers.row_base import ForkedRows

MODES = {
    "forked": ForkedRows,
    "rows-never": lambda p: EagleRows(p, compaction="never"),
    "rows-auto": lambda p: EagleRows(p, compaction="auto"),
    "rows-always": lambda p: EagleRows(p, compaction="always"),
}


def _mode(name: str):
    def switch(decoder) -> None:
        # The batch form the decode loop drafts through (`Proposer.rows`).
        EagleProposer.rows = lambda proposer, compaction="auto": MODES[name](proposer)
    return switch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, batches=2)
    compare(ap.parse_args(), {m: _mode(m) for m in MODES}, baseline="forked", same_drafts=True)


if __name__ == "__main__":
    main()
