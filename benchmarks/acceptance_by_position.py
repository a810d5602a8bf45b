"""Accepted tokens per step as a function of the position in the sequence, past the heads' training windows.

    python benchmarks/acceptance_by_position.py --heads medusa=/tmp/dm/runs/medusa/heads \\
        --heads eagle3=/tmp/dm/runs/eagle3/heads [--heads eagle3-sw256=/tmp/dm/runs/eagle3/heads@sliding_window=256] \\
        [--target smollm2] --documents FILE [FILE ...] [--num-prompts 4] [--offsets 128,384,640,896] [--new-tokens 128] [--bucket 256] \\
        [--context 1152] [--short-context 128] [--tree default|saved] --out DIR

Trained drafters are known to collapse on positions longer than their training windows (a config
trains on windows of ``data.max_length`` tokens). This measures it on real decodes: each prompt is
the start of a held-out document (bos + text: ``--documents``, text files neither the target nor the
heads trained on), cut at several offsets; from each cut the target's greedy continuation of
``--new-tokens`` is decoded speculatively (always the full draft: ``draft_budget=None``), checked
equal to ``target.generate(do_sample=False)``, and every verify step is binned by the position of
its first new token. The prompts are the same files at every offset, so a change with the offset is
the position or the text deeper in the file (Medusa and Hydra heads, whose drafting reads no
positions, show how much is the text). Two controls: ``--short-context N`` also decodes each cut from only its last N
prompt tokens (positions from 0; the target then writes its own, different, continuation), and a
windowed variant of the same heads (``@sliding_window=W``, below) decodes the very same target text
with a drafter that sees only the last W positions: the cleanest split of drafter vs text.

``--context`` raises the target's ``max_position_embeddings`` for the run (default RoPE computes
any position; the decoder refuses prompts past the configured context): positions past the
target's own configured context are beyond its own training too, which the report says next to
the curve.

A heads spec ``NAME=PATH@key=value`` loads PATH and sets an option on the loaded heads before
decoding (``sliding_window=N`` on EAGLE/EAGLE-3 heads: the draft layer attends to the last N
positions only), so heads trained without it are measured with it, side by side.

Writes DIR/results.json (every step of every decode) and DIR/summary.md (mean accepted tokens per
step per position bucket, per heads; per-prompt min-max in brackets).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import draftheads as dh
from draftheads.atomic import write_text_atomically
from draftheads.target import load_target


def heldout_documents(tokenizer, count: int, min_tokens: int, files: list[str]) -> list[tuple[str, torch.Tensor]]:
    """The first ``count`` documents with at least ``min_tokens`` tokens, as bos + text, the way a
    training window starts (``data.tokenize.tokenize_text``): each of ``files`` is one document."""
    documents = [(name, Path(name).read_text(encoding="utf-8")) for name in files]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    found = []
    for name, text in documents:
        ids = bos + tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) >= min_tokens:
            found.append((name, torch.tensor([ids], dtype=torch.long)))
        if len(found) == count:
            return found
    raise SystemExit(f"only {len(found)} documents have {min_tokens}+ tokens; pass more or longer --documents, "
                     "or lower --num-prompts or the offsets")


def parse_heads(spec: str) -> tuple[str, str, dict[str, int]]:
    """``NAME=PATH[@key=value,...]`` -> (name, path, options)."""
    if "=" not in spec:
        raise SystemExit(f"--heads wants NAME=PATH[@key=value], got {spec!r}")
    name, rest = spec.split("=", 1)
    path, _, opts = rest.partition("@")
    options = {}
    for item in filter(None, opts.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"heads option {item!r} in {spec!r} wants key=value")
        options[key] = int(value)
    return name, path, options


def load(path: str, target, options: dict[str, int]):
    heads = dh.load_heads(path, target=target)
    for key, value in options.items():
        setter = getattr(heads, f"set_{key}", None)
        if setter is None:
            raise SystemExit(f"{type(heads).__name__} has no option {key!r} (no set_{key} method)")
        setter(value)
    return heads


def step_positions(prompt_len: int, accept_lengths: list[int]) -> list[int]:
    """Position of the first token each verify step commits (the prefill's token is at prompt_len)."""
    positions, pos = [], prompt_len + 1
    for n in accept_lengths:
        positions.append(pos)
        pos += n
    return positions


def as_json(tree) -> object:
    """What the report records of a tree: "saved" (the heads' own plan), a Medusa-style list of
    choices, or an EAGLE dynamic tree's settings (a dataclass)."""
    if tree is None:
        return "saved"
    return dataclasses.asdict(tree) if dataclasses.is_dataclass(tree) else tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2", help="a model folder, a Hub id or a target name")
    ap.add_argument("--documents", nargs="+", required=True, metavar="FILE",
                    help="held-out text files, one document each, longer than the largest offset + --new-tokens")
    ap.add_argument("--heads", action="append", help="NAME=PATH[@key=value,...] (repeatable)")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--offsets", default="128,384,640,896", help="prompt lengths (tokens) at which decoding starts")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--bucket", type=int, default=256, help="position bucket width for the curve")
    ap.add_argument("--context", type=int, default=None,
                    help="raise the target's max_position_embeddings to this for the run (default: as configured)")
    ap.add_argument("--short-context", type=int, default=0,
                    help="also decode each cut from only its last N prompt tokens (0: off)")
    ap.add_argument("--tree", choices=["default", "saved"], default="default",
                    help="default: this device's default tree for the head type (the same policy for every type); "
                         "saved: the tree saved with the heads")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    ap.add_argument("--summarize", action="store_true",
                    help="only rewrite DIR/summary.md from DIR/results.json (a finished or an interrupted run)")
    args = ap.parse_args()
    if args.summarize:
        saved = json.loads((Path(args.out) / "results.json").read_text())
        summary = summarize(saved["records"], list(saved["meta"]["heads"]), saved["meta"]["bucket"], saved["meta"])
        write_text_atomically(Path(args.out) / "summary.md", summary)
        print(summary)
        return
    if not args.heads:
        ap.error("--heads NAME=PATH is required (repeatable)")
    torch.set_num_threads(args.threads)
    offsets = [int(x) for x in args.offsets.split(",")]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()

    target, tokenizer = load_target(args.target, device=torch.device("cpu"), dtype="auto")
    trained_context = int(target.config.max_position_embeddings)
    if args.context:
        target.config.max_position_embeddings = args.context
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    docs = heldout_documents(tokenizer, args.num_prompts, max(offsets) + args.new_tokens, args.documents)

    from draftheads.inference.default_tree import device_default

    decoders = {}
    for spec in args.heads:
        name, path, options = parse_heads(spec)
        heads = load(path, target, options)
        tree = device_default(heads, "cpu") if args.tree == "default" else None
        # draft_budget=None: always the full draft. The default online budget swaps in plain steps
        # when drafting does not pay at the measured speed, which on a loaded machine is timing, not acceptance.
        # batch_plan=None: draft even where the heads' plan decodes plainly on this machine.
        # prompt_lookup=False: the heads alone, not prompt lookup's copies where their plan puts it in front.
        decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draft_budget=None, batch_plan=None, prompt_lookup=False)
        decoders[name] = (decoder, {"path": path, "options": options, "tree": as_json(tree)})

    cuts = []  # (doc, offset, kind, prompt ids)
    for doc_name, ids in docs:
        for off in offsets:
            cuts.append((doc_name, off, "long", ids[:, :off]))
            if args.short_context and off > args.short_context:
                cuts.append((doc_name, off, "short", ids[:, off - args.short_context : off]))

    meta = {
        "command": "python benchmarks/acceptance_by_position.py " + " ".join(sys.argv[1:]),
        "target": args.target, "target_trained_context": trained_context, "context": args.context or trained_context,
        "docs": [d for d, _ in docs], "offsets": offsets, "new_tokens": args.new_tokens, "bucket": args.bucket,
        "heads": {n: info for n, (_, info) in decoders.items()},
        "torch": torch.__version__, "machine": platform.machine(), "load_at_start": os.getloadavg(),
    }
    records = []
    with torch.inference_mode():
        for doc_name, off, kind, prompt in cuts:
            ref = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=args.new_tokens, pad_token_id=pad)
            for name, (decoder, _) in decoders.items():
                out = decoder.generate(prompt, max_new_tokens=args.new_tokens, temperature=0.0)
                if not torch.equal(out.sequences.cpu(), ref):
                    raise AssertionError(f"{name}: output differs from target.generate on {doc_name} cut at {off} ({kind})")
                lengths = [int(n) for n in out.accept_lengths]
                records.append({"heads": name, "doc": doc_name, "offset": off, "kind": kind,
                                "prompt_tokens": prompt.shape[1], "accept_lengths": lengths,
                                "positions": step_positions(prompt.shape[1], lengths)})
            write_text_atomically(out_dir / "results.json", json.dumps({"meta": meta, "records": records}, indent=1))
            print(f"{doc_name} @{off} {kind}: " + " ".join(
                f"{r['heads']} {statistics.mean(r['accept_lengths']):.2f}" for r in records[-len(decoders):]), flush=True)

    meta["wall_s"] = round(time.time() - started, 1)
    meta["cpu_s"] = round(time.process_time(), 1)
    meta["load_at_end"] = os.getloadavg()
    write_text_atomically(out_dir / "results.json", json.dumps({"meta": meta, "records": records}, indent=1))
    summary = summarize(records, list(decoders), args.bucket, meta)
    write_text_atomically(out_dir / "summary.md", summary)
    print(summary)


def summarize(records: list[dict], names: list[str], bucket: int, meta: dict) -> str:
    """Mean accepted tokens per step per position bucket (every step whose first token falls in
    it), with the min-max of the per-document means and the step count; the short-context control
    by offset."""
    def bucket_of(pos: int) -> int:
        return pos // bucket

    lines = [f"# Accepted tokens per step by position ({meta['target']}, context {meta['context']}, "
             f"target trained on {meta['target_trained_context']})", "",
             f"command: `{meta['command']}`", "",
             f"{len(meta['docs'])} held-out files ({', '.join(meta['docs'])}), cut at {meta['offsets']}, "
             f"{meta['new_tokens']} new tokens each, greedy, every output equal to target.generate. "
             f"Wall {meta.get('wall_s', '(interrupted)')} s, CPU {meta.get('cpu_s', '-')} s. Cell: mean accepted tokens per step [min-max over files] (steps).", ""]
    buckets = sorted({bucket_of(p) for r in records if r["kind"] == "long" for p in r["positions"]})
    lines.append("| heads | " + " | ".join(f"{b * bucket}-{(b + 1) * bucket}" for b in buckets) + " |")
    lines.append("|---|" + "---|" * len(buckets))
    for name in names:
        cells = []
        for b in buckets:
            per_doc: dict[str, list[int]] = {}
            for r in records:
                if r["heads"] != name or r["kind"] != "long":
                    continue
                for p, n in zip(r["positions"], r["accept_lengths"]):
                    if bucket_of(p) == b:
                        per_doc.setdefault(r["doc"], []).append(n)
            steps = [n for v in per_doc.values() for n in v]
            if not steps:
                cells.append("-")
                continue
            means = [statistics.mean(v) for v in per_doc.values()]
            cells.append(f"{statistics.mean(steps):.2f} [{min(means):.2f}-{max(means):.2f}] ({len(steps)})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if any(r["kind"] == "short" for r in records):
        lines += ["", "Same cut, whole prompt (long) vs its last tokens only (short, positions from 0): mean accepted "
                  "tokens per step over all files.", "",
                  "| heads | " + " | ".join(f"@{o} long / short" for o in meta["offsets"]) + " |",
                  "|---|" + "---|" * len(meta["offsets"])]
        for name in names:
            cells = []
            for off in meta["offsets"]:
                pair = []
                for kind in ("long", "short"):
                    steps = [n for r in records if r["heads"] == name and r["offset"] == off and r["kind"] == kind
                             for n in r["accept_lengths"]]
                    pair.append(f"{statistics.mean(steps):.2f}" if steps else "-")
                cells.append(" / ".join(pair))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
