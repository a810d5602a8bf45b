"""Peak host memory of a speculative prefill, per proposer: all hidden states vs only those read.

    python benchmarks/prefill_memory.py [--layers 12] [--hidden 512] [--vocab 8192] [--prompt 4096]
        [--baseline-src DIR] [--out benchmarks/measurements/prefill-memory]

Each case runs in a fresh subprocess (torch's allocations are invisible to tracemalloc, and the
process high-water mark never comes down): build a random-weight Llama, build the decoder, then
`generate(max_new_tokens=1)` = the prefill. Reported: the process's peak RSS
(`resource.getrusage(...).ru_maxrss`) after the prefill, minus its RSS just before it.
``--baseline-src`` points at a checkout of the package before this change (e.g. made with
`git archive <commit> | tar -x -C DIR`): its cases run with that code on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from draftheads.atomic import write_text_atomically

CASE = r"""
import json, resource, sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import draftheads as dh

layers, hidden, vocab, prompt_len, proposer = sys.argv[1:6]
layers, hidden, vocab, prompt_len = int(layers), int(hidden), int(vocab), int(prompt_len)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                  num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                  max_position_embeddings=prompt_len + 64, tie_word_embeddings=False)
target = LlamaForCausalLM(cfg).eval()
if proposer == "prompt_lookup":
    prop = dh.PromptLookupProposer()
elif proposer == "medusa":
    prop = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1)
else:
    prop = dh.Eagle3Head.for_target(target, num_heads=3, draft_vocab_size=1024)
    prop.set_draft_vocab(torch.arange(vocab, 0, -1))  # untrained heads: any mapping will do
decoder = dh.SpeculativeDecoder(target, prop)
ids = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(0))
def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (resource.getpagesize() // 1024)
before = rss_kib()
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
decoder.generate(ids, max_new_tokens=1, eos_token_id=[])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rss_before_mib": before / 1024, "peak_before_mib": peak_before / 1024, "peak_mib": peak / 1024,
                  "prefill_peak_mib": (peak - before) / 1024, "package": dh.__file__}))
"""


def run_case(src: str, args: argparse.Namespace, proposer: str) -> dict:
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", CASE, str(args.layers), str(args.hidden), str(args.vocab), str(args.prompt), proposer]
    # cwd=src: `python -c` puts the working directory first on sys.path, so run from another
    # checkout it would import THAT package, whatever PYTHONPATH says (an earlier version of this
    # script compared the current code with itself that way).
    done = subprocess.run(cmd, env=env, cwd=src, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"case {proposer} with {src} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["package"]).resolve().is_relative_to(Path(src).resolve()):
        raise SystemExit(f"the run meant for {src} imported draftheads from {result['package']}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--proposers", default="prompt_lookup,medusa,eagle3")
    ap.add_argument("--baseline-src", default=None, help="a checkout of the package before the change")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parents[1])
    versions = {"after": here} | ({"before": args.baseline_src} if args.baseline_src else {})
    rows = []
    for proposer in args.proposers.split(","):
        for name, src in versions.items():  # interleaved: before and after of one proposer back to back
            row = {"proposer": proposer, "code": name, **run_case(src, args, proposer)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    states_mib = (args.layers + 1) * args.prompt * args.hidden * 4 / 2**20
    lines = [
        f"# Prefill peak memory: random Llama {args.layers}x{args.hidden}, vocab {args.vocab}, {args.prompt}-token prompt, fp32, CPU",
        "",
        f"All L+1 hidden states of the prompt take {states_mib:.0f} MiB here.",
        "",
        "| proposer | code | RSS before prefill (MiB) | peak RSS (MiB) | prefill peak over RSS before (MiB) |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [f"| {r['proposer']} | {r['code']} | {r['rss_before_mib']:.0f} | {r['peak_mib']:.0f} | {r['prefill_peak_mib']:.0f} |"
              for r in rows]
    print("\n".join(lines))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomically(out / "results.json", json.dumps({"args": vars(args), "rows": rows}, indent=1))
        write_text_atomically(out / "results.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
