"""Does EAGLE's fc bias matter? vLLM's EAGLE-1 draft has none (and drops one without a word), so new
EAGLE heads default to ``heads.fc_bias: false``. This trains the same heads with the bias off and on,
seed by seed (interleaved), and reports the final evaluation: simulated acceptance length and
top-1 accuracy of the first draft step.

    python benchmarks/bench_eagle_fc_bias.py --config configs/demo-eagle.yaml --seeds 0 1 2 [key=value ...]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/demo-eagle.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides for both runs")
    args = parser.parse_args()

    from draftheads.config import load_config
    from draftheads.train.loop import run

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for bias in (False, True):
                out = Path(tmp) / f"seed{seed}-bias{int(bias)}"
                cfg = load_config(args.config, [*args.overrides, f"heads.fc_bias={str(bias).lower()}",
                                                f"train.seed={seed}", f"train.output_dir={out}", "train.save_every=0"])
                result = run(cfg)
                final = json.loads((out / "metrics.json").read_text())["final_eval"]
                rows.append({"seed": seed, "fc_bias": bias, "acceptance_length": final["eval/acceptance_length"],
                             "top1_step0": final.get("eval/top1_head0"), "step": result.step})
                print(json.dumps(rows[-1]), flush=True)
    diffs = [on["acceptance_length"] - off["acceptance_length"] for off, on in zip(rows[::2], rows[1::2])]
    print(f"acceptance length, bias on - off, per seed: {[round(d, 4) for d in diffs]}; "
          f"median {statistics.median(diffs):+.4f}, range {min(diffs):+.4f} .. {max(diffs):+.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "diffs": diffs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
