"""`draftheads bench` with EAGLE / EAGLE-3 drafted the way they were before `EagleRows`: one forked
`EagleProposer` per row (rows x depths small draft forwards per step). For before/after figures
with the same code otherwise; every argument goes to `draftheads bench`.

    python benchmarks/bench_forked_eagle.py --target demo --heads DIR --batch-size 1,4,8 --out OUT
"""
from __future__ import annotations

import sys

from draftheads.cli import main
from draftheads.inference.proposers.eagle import EagleProposer
from draftheads.inference.proposers.row_base import ForkedRows

if __name__ == "__main__":
    EagleProposer.rows = lambda proposer, compaction="auto": ForkedRows(proposer)  # the batch form the loop drafts through
    raise SystemExit(main(["bench", *sys.argv[1:]]))
