"""`draftheads distill` throughput: the hf engine vs the vllm engine on the same rows.

    python benchmarks/bench_distill_engines.py [--target smollm2] [--questions chat] \
        [--vllm-python /path/to/.venv-vllm/bin/python] [--rows 16 --max-new-tokens 64 --batch-size 8] \
        [--out results/distill-engines]

Answers the same chat rows (the first turns of ``--questions`` as user turns) with the target
through both engines, greedy fp32, and compares generated tokens per second of generation (model
load and vLLM engine start excluded; both reported by distill's sidecar).
vLLM runs in its own venv (it pins its own torch) through tests/vllm_distill_worker.py. The runs
alternate ``--pairs`` times. Also checks that both wrote the same rows.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-python", default=str(Path(sys.executable).parents[2] / ".venv-vllm" / "bin" / "python"))
    p.add_argument("--target", default="smollm2", help="a model folder or a target name (default: smollm2)")
    p.add_argument("--questions", default="chat", metavar="NAME_OR_FILE",
                   help="chat (default: the package's general chat prompts; distill refuses the evaluation sets), "
                        "a Spec-Bench .jsonl or a text file")
    p.add_argument("--out", default="results/distill-engines")
    p.add_argument("--work", default="/tmp/draftheads-bench-distill")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--pairs", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftheads.bench.questions import load_questions, select
    from draftheads.data.distill import DistillSettings, HFEngine, distill
    from draftheads.target import resolve_target

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    target = resolve_target(args.target)
    tok = AutoTokenizer.from_pretrained(target)
    # one user turn each, with an assistant turn that distill replaces by the target's answer
    rows = [{"conversations": [{"from": "human", "value": q.turns[0]}, {"from": "gpt", "value": "-"}]}
            for q in select(load_questions(args.questions), None, args.rows)]
    data = work / f"distill-{len(rows)}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": str(args.threads)}
    env.pop("PYTHONPATH", None)
    rates: dict[str, list[float]] = {"hf": [], "vllm": []}
    same = []
    for pair in range(args.pairs):
        outs = {}
        for engine in (("hf", "vllm") if pair % 2 == 0 else ("vllm", "hf")):
            out = work / f"distill-{engine}-{pair}.jsonl"
            for f in (out, out.with_name(out.name + ".distill.json")):
                f.unlink(missing_ok=True)
            if engine == "hf":
                s = DistillSettings(target=str(target), data=str(data), out=str(out), max_new_tokens=args.max_new_tokens,
                                    batch_size=args.batch_size, eval_overlap="warn")  # throughput material only
                stats = distill(s, HFEngine(model, tok, s), tok, progress=False)
                tokens, seconds = stats.generated_tokens, stats.seconds
            else:
                proc = subprocess.run(
                    [args.vllm_python, str(ROOT / "tests" / "vllm_distill_worker.py"), str(ROOT), str(target), str(data),
                     str(out), str(args.max_new_tokens), str(args.batch_size), "warn"],
                    capture_output=True, text=True, env=env, timeout=1200,
                )
                if proc.returncode != 0:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    return 1
                stats = json.loads(out.with_name(out.name + ".distill.json").read_text())["stats"]
                tokens, seconds = stats["generated_tokens"], stats["seconds"]
            rates[engine].append(tokens / seconds)
            outs[engine] = out.read_text()
            print(f"pair {pair + 1} {engine}: {tokens} tokens in {seconds:.1f}s = {tokens / seconds:.1f} tok/s", flush=True)
        same.append(outs["hf"] == outs["vllm"])
    ratios = [v / h for v, h in zip(rates["vllm"], rates["hf"])]
    result = {
        "target": f"{args.target}, fp32, {args.threads} thread(s)",
        "rows": args.rows, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "tokens_per_second": rates, "ratio_vllm_over_hf": ratios, "ratio_median": statistics.median(ratios),
        "same_rows": same, "command": " ".join(sys.argv),
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
