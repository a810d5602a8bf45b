"""Batched speculative decoding: cache holes kept masked vs compacted, side by side.

The batched decode (draftheads/inference/kv/ragged.py, RaggedKV) shares one KV cache between rows that accept
different numbers of tokens. "never" keeps the holes and masks them (attention runs over them),
"always" gathers the whole cache after every step (no holes, one full-cache copy per step),
"auto" compacts only when a finished row is dropped (a copy made anyway) or holes exceed a
quarter of the cache. Every policy decodes the same left-padded batches (prompts of different
lengths), interleaved round by round; the figure is each policy's tokens/s relative to "never"
on the same batch, median and spread over batches and rounds (`batch_ab.py`). Outputs are checked equal.

    python benchmarks/bench_batch_compaction.py --heads runs/demo/heads --batch-sizes 4,8
"""
from __future__ import annotations

import argparse

from batch_ab import add_arguments, compare

POLICIES = ("never", "auto", "always")


def _policy(name: str):
    def switch(decoder) -> None:
        decoder.compaction = name
    return switch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(ap, batches=3)
    compare(ap.parse_args(), {p: _policy(p) for p in POLICIES}, baseline="never")


if __name__ == "__main__":
    main()
