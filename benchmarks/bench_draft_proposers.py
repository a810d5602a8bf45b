"""Draft-model and prompt-lookup decoding, side by side with transformers' own versions.

    python benchmarks/bench_draft_proposers.py --target PATH --draft PATH [--prompts FILE] [--max-new-tokens 128]
    python benchmarks/bench_draft_proposers.py            # tiny random models: a smoke run of the script

Rows (greedy, one prompt at a time, same prompts for every row):
    hf-greedy          target.generate(do_sample=False)                 the baseline
    hf-assisted        target.generate(assistant_model=draft)           transformers' speculative decoding
    hf-prompt-lookup   target.generate(prompt_lookup_num_tokens=10)
    dh-draft-gK        SpeculativeDecoder(target, DraftModelProposer(draft, gamma=K))
    dh-draft-auto      ... gamma="auto"
    dh-prompt-lookup   SpeculativeDecoder(target, PromptLookupProposer())
Each row reports tokens/s, its ratio to hf-greedy, tokens per target forward where known, and
whether its tokens equal hf-greedy's (they must for the dh rows). Ratios measured in one run on
one machine are what to compare; absolute numbers depend on the machine's load.
"""
from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import draftheads as dh


def tiny(seed: int, hidden: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(
        "llama", vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(cfg).eval()


def load(args) -> tuple[torch.nn.Module, torch.nn.Module, list[torch.Tensor], object]:
    device = torch.device(args.device)
    if args.target is None:
        target, draft = tiny(0, 256, 6), tiny(1, 64, 1)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, 256, (1, 32), generator=g) for _ in range(args.num_prompts)]
        return target.to(device), draft.to(device), prompts, None
    dtype = getattr(torch, args.dtype)
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=dtype).to(device).eval()
    tok = AutoTokenizer.from_pretrained(args.target)
    dh.check_same_tokenizer(tok, AutoTokenizer.from_pretrained(args.draft))
    if args.prompts:
        texts = [t for t in open(args.prompts).read().split("\n\n") if t.strip()][: args.num_prompts]
    else:
        texts = ["def fibonacci(n):\n    ", "import os\nimport sys\n\n\ndef main():\n"][: args.num_prompts]
    prompts = [tok(t, return_tensors="pt").input_ids for t in texts]
    return target, draft, prompts, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--prompts", help="text file, prompts separated by blank lines")
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gammas", default="3,5")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if (args.target is None) != (args.draft is None):
        ap.error("give both --target and --draft, or neither (tiny random models)")
    target, draft, prompts, tok = load(args)
    device = target.device
    pad = getattr(tok, "pad_token_id", None) or target.config.eos_token_id or 0
    n = args.max_new_tokens

    def hf(**extra):
        def run(ids):
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                pad_token_id=pad, eos_token_id=None, **extra,
            )
            return out, None
        return run

    def ours(proposer):
        decoder = dh.SpeculativeDecoder(target, proposer)

        def run(ids):
            out = decoder.generate(ids, max_new_tokens=n, eos_token_id=[])
            return out.sequences, out.accept_lengths
        return run

    rows = {
        "hf-greedy": hf(),
        "hf-assisted": hf(assistant_model=draft),
        "hf-prompt-lookup": hf(prompt_lookup_num_tokens=10),
    }
    for k in (int(g) for g in args.gammas.split(",")):
        rows[f"dh-draft-g{k}"] = ours(dh.DraftModelProposer(draft, gamma=k))
    rows["dh-draft-auto"] = ours(dh.DraftModelProposer(draft, gamma="auto"))
    rows["dh-prompt-lookup"] = ours(dh.PromptLookupProposer())

    prompts = [p.to(device) for p in prompts]
    for run in rows.values():  # warm-up (kernels, caches, the adaptive draft's first estimates)
        run(prompts[0][:, :8])
    # Interleaved: every method runs on prompt i before any runs on prompt i+1, so drifts in the
    # machine's speed hit all methods alike.
    reference: dict[int, torch.Tensor] = {}
    totals = {name: {"seconds": 0.0, "tokens": 0, "accept": [], "same": True} for name in rows}
    for i, ids in enumerate(prompts):
        for name, run in rows.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            seqs, acc = run(ids)
            if device.type == "cuda":
                torch.cuda.synchronize()
            total = totals[name]
            total["seconds"] += time.perf_counter() - t0
            new = seqs[0, ids.shape[1] :].cpu()
            total["tokens"] += new.numel()
            total["accept"] += acc or []
            if name == "hf-greedy":
                reference[i] = new
            else:
                total["same"] &= torch.equal(new, reference[i])
    results = {
        name: (t["tokens"] / t["seconds"], sum(t["accept"]) / len(t["accept"]) if t["accept"] else float("nan"), t["same"])
        for name, t in totals.items()
    }
    base = results["hf-greedy"][0]
    print(f"{'method':<18} {'tok/s':>9} {'vs greedy':>9} {'tok/fwd':>8}  same-as-greedy")
    for name, (rate, acc, same) in results.items():
        print(f"{name:<18} {rate:9.1f} {rate / base:8.2f}x {acc:8.2f}  {same}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
