"""One prepared evidence run for an accelerator (`benchmarks/gpu.sh` calls it); runs on a CPU too.

    python benchmarks/gpu_report.py --out DIR [--small] [--target NAME_OR_DIR --heads DIR [--questions mt-bench]]

Sections (each recorded even when another fails; a failure is written into the report, not hidden):
1. exactness: greedy speculative decoding == `generate` on tiny random Llama, Qwen2, Mistral and
   Gemma, in fp32 and bf16, with random Medusa heads (tree path) and prompt lookup (chain path);
2. target speedups: the given target + heads with the device's default (large on CUDA) tree vs plain
   `generate` on the first turns of --questions (benchmarks/prompts.py; skipped without --target/--heads);
3. verify time of 1/16/64/128 tree tokens vs one token on a 7B-shaped random-weight Llama in bf16
   (small mode: a 2-layer model);
4. per-step time outside the target forward and host reads of device data per step;
5. batch 1/4/16 tokens/s through `SpeculativeDecoder` with [B, T] inputs (skipped, with the
   decoder's own message, where batches are refused);
6. batch 1 with the dynamic cache vs cache="static" vs static + torch.compile of the verify forward
   (inductor on CUDA, dynamo's eager backend on a CPU) on the given target + heads, else an 8-layer
   Llama with 7B's layer shape in bf16 (small mode: a 2-layer model), compile time apart;
7. heads-training tokens/s (Medusa heads, forward + backward + optimizer step on target features).
Writes DIR/report.json and DIR/report.md.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

import draftheads as dh  # noqa: E402
from draftheads.tune.calibrate import measure_verify_times  # noqa: E402
from draftheads.inference.host_syncs import HostSyncCounter  # noqa: E402

ARCHS = {"llama": {}, "qwen2": {}, "mistral": {"sliding_window": 24}, "gemma": {"head_dim": 16}}


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tiny(arch: str, device: torch.device, dtype: torch.dtype, hidden: int = 64, layers: int = 2, vocab: int = 128):
    torch.manual_seed(0)
    cfg = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
               eos_token_id=2, pad_token_id=0, **ARCHS.get(arch, {}))
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **cfg), attn_implementation="sdpa")
    return model.to(device=device, dtype=dtype).eval()


def random_llama(cfg: dict, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A random-weight Llama of ``cfg``'s shape, built directly on ``device`` in ``dtype`` (a 7B-shaped
    model in fp32 on the host first would need 4x its bf16 memory)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device(device):
        torch.set_default_dtype(dtype)
        try:
            return LlamaForCausalLM(LlamaConfig(max_position_embeddings=4096, **cfg)).eval()
        finally:
            torch.set_default_dtype(torch.float32)


def reference(target, ids: torch.Tensor, n: int) -> torch.Tensor:
    return target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                           min_new_tokens=n, eos_token_id=None, pad_token_id=0).cpu()


def exactness(args, device) -> dict:
    rows = []
    n_new = 8 if args.small else 64
    for arch in ARCHS:
        for dtype in (torch.float32, torch.bfloat16):
            target = tiny(arch, device, dtype)
            heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1).to(device=device, dtype=dtype)
            ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1)).to(device)
            ref = reference(target, ids, n_new)
            for name, proposer in (("medusa", heads), ("prompt_lookup", dh.PromptLookupProposer(num_tokens=4))):
                out = dh.SpeculativeDecoder(target, proposer).generate(ids, max_new_tokens=n_new, eos_token_id=[])
                got = out.sequences[0, ids.shape[1]:]
                want = ref[0, ids.shape[1]:]
                first_diff = next((i for i, (a, b) in enumerate(zip(got.tolist(), want.tolist())) if a != b), None)
                rows.append({"arch": arch, "dtype": str(dtype).removeprefix("torch."), "proposer": name,
                             "identical": first_diff is None, "first_difference": first_diff, "new_tokens": n_new})
    return {"rows": rows, "all_identical": all(r["identical"] for r in rows)}


def timed_generate(fn, device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def load_given_target(args, device):
    """--target (a folder or a name such as smollm2, resolved as every command resolves it) in fp32."""
    from draftheads.target import resolve_target

    path = resolve_target(args.target)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").to(device).eval(), path


def target_speedups(args, device) -> dict:
    if not (args.target and args.heads):
        return {"skipped": "no --target/--heads given (heads are trained on the machine that trains them)"}
    from transformers import AutoTokenizer

    from prompts import load_prompts

    target, path = load_given_target(args, device)
    tok = AutoTokenizer.from_pretrained(path)
    heads = dh.load_heads(args.heads, target=target).to(device)
    decoder = dh.SpeculativeDecoder(target, heads)
    rows = []
    for prompt in load_prompts(tok, args.questions, 2 if args.small else 8):
        ids = prompt.to(device)
        n = 32 if args.small else 128
        plain = timed_generate(lambda: reference(target, ids, n), device, 3)
        spec_out = {}
        spec = timed_generate(lambda: spec_out.setdefault("o", decoder.generate(ids, max_new_tokens=n, eos_token_id=[])), device, 3)
        out = spec_out["o"]
        rows.append({"plain_s": plain, "spec_s": spec, "speedup": plain / spec, "mean_accept": out.mean_accept_length,
                     "identical": torch.equal(out.sequences, reference(target, ids, n))})
    return {"tree_nodes": decoder.proposer.shape.size if hasattr(decoder.proposer, "shape") else None,
            "median_speedup": statistics.median(r["speedup"] for r in rows), "rows": rows}


def verify_times(args, device) -> dict:
    if args.small:
        cfg = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=4, vocab_size=1024)
        dtype, context = torch.float32, 64
    else:  # Llama-2-7B's shape
        cfg = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=32, vocab_size=32000)
        dtype, context = torch.bfloat16, 1024
    target = random_llama(cfg, dtype, device)
    sizes = [1, 16, 64, 128]
    times = measure_verify_times(target, sizes, context=context, repeats=3 if args.small else 15)
    del target
    return {"config": cfg, "dtype": str(dtype), "context": context, "seconds": times,
            "ratio_to_one_token": {n: times[n] / times[1] for n in sizes}}


def step_overhead(args, device) -> dict:
    target = tiny("llama", device, torch.float32, hidden=128 if args.small else 512, layers=2 if args.small else 8, vocab=1024)
    heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1).to(device)
    ids = torch.randint(3, 1024, (1, 32), generator=torch.Generator().manual_seed(2)).to(device)
    result = {}
    for name, proposer in (("medusa", heads), ("prompt_lookup", dh.PromptLookupProposer(num_tokens=4))):
        decoder = dh.SpeculativeDecoder(target, proposer)
        decoder.generate(ids, max_new_tokens=8, eos_token_id=[])
        outs = [decoder.generate(ids, max_new_tokens=16 if args.small else 128, eos_token_id=[]) for _ in range(3)]
        per_step = [1000 * (o.decode_seconds - o.target_seconds) / max(o.stats["steps"], 1) for o in outs]
        with torch.inference_mode(), HostSyncCounter(target, heads) as counter:
            out = decoder.generate(ids, max_new_tokens=16, eos_token_id=[])
        result[name] = {"outside_ms_per_step": statistics.median(per_step), "steps": out.stats["steps"],
                        "host_reads_outside_forward": dict(counter.outside), "host_reads_inside_forward": dict(counter.inside),
                        "host_reads_per_step": counter.total_outside / max(out.stats["steps"], 1)}
    return result


def batch_throughput(args, device) -> dict:
    target = tiny("llama", device, torch.float32, hidden=128 if args.small else 512, layers=2 if args.small else 8, vocab=1024)
    heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1).to(device)
    decoder = dh.SpeculativeDecoder(target, heads)
    n = 8 if args.small else 64
    rows = []
    for batch in (1, 4, 16):
        ids = torch.randint(3, 1024, (batch, 16), generator=torch.Generator().manual_seed(3)).to(device)
        try:
            mask = {} if batch == 1 else {"attention_mask": torch.ones_like(ids)}  # batch 1: today's API
            spec = timed_generate(lambda: decoder.generate(ids, max_new_tokens=n, eos_token_id=[], **mask), device, 2)
        except (NotImplementedError, ValueError, TypeError) as e:
            rows.append({"batch": batch, "skipped": f"{type(e).__name__}: {e}"})
            continue
        plain = timed_generate(lambda: reference(target, ids, n), device, 2)
        rows.append({"batch": batch, "spec_tokens_per_s": batch * n / spec, "plain_tokens_per_s": batch * n / plain})
    return {"rows": rows}


def static_cache(args, device) -> dict:
    """Batch 1: the default dynamic cache vs cache="static" vs static + torch.compile of the verify
    forward, interleaved rounds, tokens/s per call (prefill included), compile time apart."""
    if args.target and args.heads:
        target, _ = load_given_target(args, device)
        heads = dh.load_heads(args.heads, target=target).to(device)
        model = f"target {args.target}, heads {args.heads}"
    else:
        if args.small:
            cfg, dtype = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=128), torch.float32
        else:  # Llama-2-7B's layer shape, 8 of its 32 layers: representative per-layer cost, 4x less compiling
            cfg, dtype = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=8, num_attention_heads=32,
                              num_key_value_heads=32, vocab_size=32000), torch.bfloat16
        torch.manual_seed(0)
        target = random_llama(cfg, dtype, device)
        heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1).to(device=device, dtype=dtype)
        model = f"random Llama {cfg} in {dtype}, random Medusa heads"
    # On a CPU inductor compiles for minutes: --small checks the plumbing with dynamo's eager backend.
    backend = "inductor" if device.type == "cuda" else "eager"
    prompt_len, n, rounds = (16, 8, 1) if args.small else (512, 128, 3)
    vocab = target.get_output_embeddings().weight.shape[0]
    ids = torch.randint(3, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(4)).to(device)
    decoders = {"dynamic": dh.SpeculativeDecoder(target, heads),
                "static": dh.SpeculativeDecoder(target, heads, cache="static"),
                "static+compile": dh.SpeculativeDecoder(target, heads, cache="static", compile=backend)}
    outputs, warmup, times = {}, {}, {name: [] for name in decoders}
    for name, decoder in decoders.items():
        warmup[name] = timed_generate(lambda: outputs.setdefault(name, decoder.generate(ids, max_new_tokens=n, eos_token_id=[])),
                                      device, 1)
    for r in range(rounds):
        names = list(decoders)[r % 3:] + list(decoders)[: r % 3]
        for name in names:
            times[name].append(timed_generate(lambda: decoders[name].generate(ids, max_new_tokens=n, eos_token_id=[]), device, 1))
    ref = reference(target, ids, n)
    rows = []
    for name in decoders:
        out = outputs[name]
        rows.append({"method": name, "tokens_per_s": n / statistics.median(times[name]),
                     "tokens_per_s_min": n / max(times[name]), "tokens_per_s_max": n / min(times[name]),
                     "speed_vs_dynamic": statistics.median(times["dynamic"]) / statistics.median(times[name]),
                     "steps": out.stats["steps"], "compile_s": max(warmup[name] - statistics.median(times[name]), 0.0),
                     "identical_to_generate": torch.equal(out.sequences.cpu(), ref),
                     "identical_to_dynamic": torch.equal(out.sequences, outputs["dynamic"].sequences)})
    return {"model": model, "backend": backend, "prompt_tokens": prompt_len, "new_tokens": n, "rounds": rounds,
            "tree_nodes": decoders["dynamic"].proposer.shape.size, "rows": rows}


def training_throughput(args, device) -> dict:
    target = tiny("llama", device, torch.float32, hidden=128 if args.small else 1024, layers=2 if args.small else 8,
                  vocab=1024 if args.small else 32000)
    heads = dh.MedusaHeads.for_target(target, num_heads=3, num_layers=1).to(device).train()
    opt = torch.optim.AdamW([p for p in heads.parameters() if p.requires_grad], lr=1e-3)
    batch, seq = (2, 64) if args.small else (8, 1024)
    ids = torch.randint(3, target.config.vocab_size, (batch, seq), device=device)
    steps = 2 if args.small else 10

    def step() -> None:
        with torch.no_grad():
            hidden = target(ids, output_hidden_states=True).hidden_states[-1]
        loss = 0.0
        for k, state in enumerate(heads.head_states(hidden)):
            logits = heads.project(state[:, : -(k + 2)], k)
            loss = loss + torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, k + 2 :].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    seconds = timed_generate(lambda: [step() for _ in range(steps)], device, 1)
    return {"tokens_per_s": batch * seq * steps / seconds, "batch": batch, "seq": seq,
            "note": "target forward + Medusa heads forward/backward/AdamW (the core of train/loop.py, without accelerate)"}


SECTIONS = {"exactness": exactness, "target_speedups": target_speedups, "verify_times": verify_times,
            "step_overhead": step_overhead, "batch_throughput": batch_throughput, "static_cache": static_cache,
            "training_throughput": training_throughput}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU, CI)")
    ap.add_argument("--target", default=None, help="target folder or name, e.g. smollm2 (sections 2 and 6)")
    ap.add_argument("--heads", default=None, help="heads folder for --target (sections 2 and 6)")
    ap.add_argument("--questions", default="mt-bench",
                    help="--target's prompts (section 2): mt-bench (default), spec-bench, chat, or a question file")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"device": device_name(device), "torch": torch.__version__, "small": args.small, "sections": {}}
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            result = SECTIONS[name](args, device)
        except Exception as e:  # noqa: BLE001 - recorded in the report, the other sections still run
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        result["section_seconds"] = time.perf_counter() - t0
        report["sections"][name] = result
        print(name, json.dumps(result, default=str)[:400], flush=True)
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    lines = [f"# draftheads device evidence ({report['device']}, torch {report['torch']}, small={args.small})", ""]
    for name, result in report["sections"].items():
        lines += [f"## {name}", "", "```json", json.dumps({k: v for k, v in result.items() if k != "traceback"},
                                                          indent=1, default=str), "```", ""]
    (out / "report.md").write_text("\n".join(lines))
    failed = [n for n, r in report["sections"].items() if "error" in r]
    if failed:
        print(f"sections with errors: {failed} (see {out / 'report.md'})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
