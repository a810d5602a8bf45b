"""Run vLLM engines described by a JSON spec and write what they did as JSON (``--out``).

Runs INSIDE the vLLM venv (its own torch and transformers), so it imports nothing from draftheads:
tests/test_vllm_engine.py and benchmarks/bench_vllm_serving.py call it in a subprocess with that
venv's python. Every engine of the spec is built in this one process, one after another (with
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` an engine starts in seconds; importing vLLM costs ~7 s once).

Spec (``--spec FILE``)::

    {"model": DIR, "max_model_len": 512, "dtype": "float32", "max_num_seqs": 16,
     "engines": [{"name": "plain", "speculative_config": null, "llm_kwargs": {}}, ...],
     "runs": [{"name": "c4", "prompts": [[ids...]], "max_tokens": 32, "batch_size": 4, "repeat": 1}, ...],
     "warmup_tokens": 0}

Every engine runs every run, in order. A run's prompts go to ``LLM.generate`` ``batch_size`` at a
time (default: all in one call), so ``batch_size`` is the number of concurrent requests; its
time is the sum over those calls. ``warmup_tokens`` > 0: one untimed, uncounted request first. Per engine and run the result holds the output token ids of the last repeat,
the wall time of each repeat, and the spec-decode counters added by each repeat (the counters
are cumulative per engine, so each run reads the difference). An engine that fails to build or
run is reported with its traceback instead of stopping the others.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

# Before vLLM is imported: in-process engine core (fast start, several engines per process),
# a small CPU KV cache, no model hub.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

SPEC_METRICS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def read_counters(llm) -> dict:
    """The spec-decode counters so far (zeros for an engine without speculation)."""
    counters = {name: 0 for name in SPEC_METRICS.values()}
    counters["accepted_per_pos"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_METRICS:
            counters[SPEC_METRICS[metric.name]] = int(metric.value)
        elif metric.name == PER_POS:
            counters["accepted_per_pos"] = [int(v) for v in metric.values]
    return counters


def difference(after: dict, before: dict) -> dict:
    out = {name: after[name] - before[name] for name in SPEC_METRICS.values()}
    prev = before["accepted_per_pos"] or [0] * len(after["accepted_per_pos"])
    out["accepted_per_pos"] = [a - b for a, b in zip(after["accepted_per_pos"], prev)]
    return out


def run_engine(spec: dict, engine: dict) -> dict:
    from vllm import LLM, SamplingParams

    kwargs = dict(
        model=spec["model"],
        dtype=spec.get("dtype", "float32"),
        max_model_len=spec.get("max_model_len", 512),
        enforce_eager=True,
        seed=spec.get("seed", 0),
        max_num_seqs=spec.get("max_num_seqs", 16),
        skip_tokenizer_init=spec.get("skip_tokenizer_init", True),
        disable_log_stats=False,
    )
    if engine.get("speculative_config") is not None:
        kwargs["speculative_config"] = engine["speculative_config"]
    kwargs.update(engine.get("llm_kwargs", {}))
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    result = {"build_seconds": time.perf_counter() - t0, "runs": {}}
    try:
        if spec.get("warmup_tokens"):
            warm = SamplingParams(temperature=0.0, max_tokens=spec["warmup_tokens"], ignore_eos=True, detokenize=False)
            llm.generate([{"prompt_token_ids": list(spec["runs"][0]["prompts"][0])}], warm, use_tqdm=False)
        for run in spec["runs"]:
            params = SamplingParams(
                temperature=0.0, max_tokens=run["max_tokens"], ignore_eos=True, detokenize=False
            )
            prompts = [{"prompt_token_ids": list(p)} for p in run["prompts"]]
            size = run.get("batch_size") or len(prompts)
            seconds, counts, outputs = [], [], None
            for _ in range(run.get("repeat", 1)):
                before = read_counters(llm)
                elapsed, outputs = 0.0, []
                for start in range(0, len(prompts), size):
                    t = time.perf_counter()
                    done = llm.generate(prompts[start : start + size], params, use_tqdm=False)
                    elapsed += time.perf_counter() - t
                    outputs += [list(o.outputs[0].token_ids) for o in done]
                seconds.append(elapsed)
                counts.append(difference(read_counters(llm), before))
            result["runs"][run["name"]] = {"outputs": outputs, "seconds": seconds, "counters": counts}
    finally:
        del llm
        gc.collect()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True, help="JSON spec file (see the module docstring)")
    parser.add_argument("--out", required=True, help="write the JSON result here (vLLM logs to stdout)")
    args = parser.parse_args()
    with open(args.spec) as f:
        spec = json.load(f)

    t0 = time.perf_counter()
    import vllm

    report = {"vllm_version": vllm.__version__, "import_seconds": time.perf_counter() - t0, "engines": {}}
    for engine in spec["engines"]:
        try:
            report["engines"][engine["name"]] = run_engine(spec, engine)
        except Exception:  # reported per engine; the caller decides what a failure means
            report["engines"][engine["name"]] = {"error": traceback.format_exc()}
        print(f"[vllm_runner] {engine['name']} done", file=sys.stderr, flush=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
