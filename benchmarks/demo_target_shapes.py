"""Demo target shapes compared by what matters for drafting. A measurement, not a test.

For each shape (``LAYERSxWIDTH``; every other setting is the default ``DemoTargetSpec``):

Costs (the built target when it exists, else random weights of the same shape; 1 torch thread;
a ``--context``-token cache; shapes interleaved round by round, medians):
- ``forward_ms``: one plain decoding step (1 token, bare ``model(...)`` forward);
- ``per_layer_ms``: forward_ms / layers;
- ``verify16_ms``: a 16-token tree through ``TreeVerifier`` (what a speculative step pays),
  and ``verify_ratio`` = verify16 / verify1 through the same path;
- ``eagle_depth_ms``: what one more depth of an EAGLE-2 draft tree costs (slope of the proposer's
  propose() time over depths 1..4, top-4, one draft layer), whole vocabulary and 512 most
  frequent tokens, also as a fraction of forward_ms.
Quality (built targets only):
- ``heldout_loss`` (nats/token, from the build metadata) and build time / throughput;
- ``distinct_4grams``: distinct / total 4-grams of greedy continuations of the held-out
  prompts (``--new-tokens``): low = degenerate, repetitive text;
- with ``--heads SHAPE=DIR`` (Medusa heads trained on that target): ``offset_top1[k][j]``, how
  often head k's top-1 equals the token j+1 positions ahead of the hidden state it reads, on
  those continuations. Head k is trained for offset k+2; offset 1 is the target's own next token.

    python benchmarks/demo_target_shapes.py --shapes 4x256,8x192,12x160 \
        [--heads 8x192=/tmp/h8/heads ...] [--out benchmarks/measurements/demo-shapes]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import torch


def parse_shape(text: str) -> tuple[int, int]:
    layers, width = text.lower().split("x")
    return int(layers), int(width)


def spec_for(shape: str):
    from draftheads.demo import DemoTargetSpec

    layers, width = parse_shape(shape)
    return dataclasses.replace(DemoTargetSpec(), num_layers=layers, hidden_size=width)


def random_llama(spec):
    """A seeded random-weight Llama of the spec's shape (costs do not depend on the weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.resolved_intermediate_size(),
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads or spec.num_heads, max_position_embeddings=spec.seq_len,
        tie_word_embeddings=spec.tie_embeddings, attn_implementation="sdpa",
    ))


def load_shape(shape: str):
    """(model, tokenizer or None, metadata or None): the built target if complete, else random weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftheads.demo import METADATA_FILE, default_target_dir, is_complete

    spec = spec_for(shape)
    folder = default_target_dir(spec)
    if is_complete(folder, spec):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
        meta = json.loads((folder / METADATA_FILE).read_text())
        return model.eval(), AutoTokenizer.from_pretrained(folder), meta
    return random_llama(spec).eval(), None, None


# -- costs ------------------------------------------------------------------------------------------
class CostProbe:
    """Timed closures for one model, so that shapes can be interleaved call by call."""

    def __init__(self, model, context: int) -> None:
        from transformers import DynamicCache

        from draftheads import EagleHead
        from draftheads.inference.proposers.eagle import EagleProposer
        from draftheads.inference.tree import Tree, TreeShape
        from draftheads.inference.verify import TreeVerifier

        self.model, self.context = model, context
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(3, vocab, (1, context), generator=gen)
        self.verifier = TreeVerifier(model)
        self.cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=self.prompt, use_cache=True, **{self.verifier.cache_arg: self.cache})
        self.trees = {
            n: Tree(TreeShape(tuple([-1] + [max(0, (i - 1) // 3) for i in range(1, n)])),
                    torch.randint(0, vocab, (n,), generator=gen))
            for n in (1, 16)
        }
        head = EagleHead.for_target(model).eval()
        head.bind_target(model)
        head.token_counts += torch.randint(0, 100, head.token_counts.shape, generator=gen)
        hidden = torch.randn(context, model.config.hidden_size, generator=gen)
        self.proposers = {}
        for vocab_size in (None, 512):
            for depth in (1, 2, 3, 4):
                p = EagleProposer(head, total_tokens=16, depth=depth, top_k=4, draft_vocab_size=vocab_size)
                p.start(self.prompt[0], hidden, None, None)
                p.propose(5, max_depth=depth)  # catch up on the prompt once
                self.proposers[(vocab_size, depth)] = p
        self.feature = hidden[-1:]

    def _drop_tree(self) -> None:
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[..., : self.context, :], layer.values[..., : self.context, :]

    @torch.no_grad()
    def forward(self) -> float:
        token = self.prompt[:, -1:]
        t0 = time.perf_counter()
        self.model(input_ids=token, use_cache=True, **{self.verifier.cache_arg: self.cache})
        seconds = time.perf_counter() - t0
        self._drop_tree()
        return seconds

    @torch.no_grad()
    def verify(self, n: int) -> float:
        t0 = time.perf_counter()
        self.verifier.forward(self.cache, self.trees[n], self.context)
        seconds = time.perf_counter() - t0
        self._drop_tree()
        return seconds

    @torch.no_grad()
    def eagle(self, vocab_size, depth: int) -> float:
        p = self.proposers[(vocab_size, depth)]
        p.accepted(torch.tensor([7]), self.feature)  # one committed position to catch up on, as in decoding
        t0 = time.perf_counter()
        p.propose(5, max_depth=depth)
        seconds = time.perf_counter() - t0
        p._cached -= 1  # keep the draft cache at the prompt length: every sample sees the same context
        p._ids.pop()
        return seconds


def measure_costs(probes: dict[str, CostProbe], rounds: int) -> dict[str, dict]:
    keys = ["forward", "verify1", "verify16"] + [f"eagle-{v}-{d}" for v in ("full", "512") for d in (1, 2, 3, 4)]
    samples = {s: {k: [] for k in keys} for s in probes}

    def call(probe: CostProbe, key: str) -> float:
        if key == "forward":
            return probe.forward()
        if key.startswith("verify"):
            return probe.verify(int(key[6:]))
        _, vocab, depth = key.split("-")
        return probe.eagle(None if vocab == "full" else 512, int(depth))

    for shape, probe in probes.items():  # warm-up
        for key in keys:
            call(probe, key)
    for _ in range(rounds):
        for shape, probe in probes.items():
            for key in keys:
                samples[shape][key].append(call(probe, key))
    out = {}
    for shape, s in samples.items():
        med = {k: statistics.median(v) * 1000 for k, v in s.items()}
        layers = probes[shape].model.config.num_hidden_layers
        depth_ms = {}
        for vocab in ("full", "512"):
            ys = [med[f"eagle-{vocab}-{d}"] for d in (1, 2, 3, 4)]
            slope = (ys[3] - ys[0]) / 3  # ms per extra depth (depth 1 = catch-up + the root's children)
            depth_ms[vocab] = {"per_depth_ms": slope, "per_depth_vs_forward": slope / med["forward"],
                               "depth1_ms": ys[0], "depth4_ms": ys[3]}
        out[shape] = {
            "forward_ms": med["forward"], "per_layer_ms": med["forward"] / layers,
            "verify1_ms": med["verify1"], "verify16_ms": med["verify16"],
            "verify_ratio": med["verify16"] / med["verify1"], "eagle": depth_ms,
        }
    return out


def train_cpu_ms_per_token(shape: str, steps: int) -> float:
    """CPU milliseconds per training token (process time, 1 thread) of the build recipe's step
    (batch x seq_len, AdamW) on random weights: process time hardly moves with other jobs'
    load, so it estimates the build time on free cores (divide by the thread speed-up)."""
    spec = spec_for(shape)
    model = random_llama(spec).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(3, spec.vocab_size, (spec.batch_size, spec.seq_len))
    times = []
    for i in range(steps + 1):
        t0 = time.process_time()
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:  # the first step allocates
            times.append(time.process_time() - t0)
    return statistics.median(times) * 1000 / batch.numel()


# -- quality ----------------------------------------------------------------------------------------
def heldout_prompts(tokenizer, count: int, prompt_tokens: int) -> list[torch.Tensor]:
    """The bench's default prompts: the first ``prompt_tokens`` tokens of held-out files."""
    from draftheads.demo import corpus_texts

    prompts = []
    for text in corpus_texts("heldout"):
        ids = tokenizer(text[: prompt_tokens * 8], return_tensors="pt").input_ids[:, :prompt_tokens]
        if ids.shape[1] == prompt_tokens:
            prompts.append(ids)
        if len(prompts) == count:
            break
    return prompts


def distinct_4grams(tokens: list[int]) -> float:
    grams = [tuple(tokens[i : i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / max(len(grams), 1)


@torch.no_grad()
def quality(model, tokenizer, prompts, new_tokens: int, heads_dir: str | None) -> dict:
    conts, seqs = [], []
    for p in prompts:
        out = model.generate(p, attention_mask=torch.ones_like(p), do_sample=False, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id)
        seqs.append(out[0])
        conts.append(out[0, p.shape[1]:].tolist())
    result = {"distinct_4grams": statistics.mean(distinct_4grams(c) for c in conts),
              "distinct_4grams_per_prompt": [round(distinct_4grams(c), 3) for c in conts]}
    if heads_dir:
        import draftheads as dh

        heads = dh.load_heads(heads_dir, target=model)
        num_heads = heads.config.num_heads
        hits = torch.zeros(num_heads, 4)
        total = torch.zeros(num_heads, 4)
        for p, seq in zip(prompts, seqs):
            hidden = model(seq[None], output_hidden_states=True).hidden_states[-1][0]
            start = p.shape[1] - 1
            for k, state in enumerate(heads.head_states(hidden)):
                top1 = heads.project(state, k).argmax(-1)
                for j in range(4):  # offset j+1
                    n = seq.numel() - (j + 1) - start
                    if n <= 0:
                        continue
                    hits[k, j] += (top1[start : start + n] == seq[start + j + 1 : start + j + 1 + n]).sum()
                    total[k, j] += n
        result["offset_top1"] = (hits / total.clamp(min=1)).tolist()
        result["heads"] = heads_dir
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x256,8x192,12x160")
    parser.add_argument("--heads", action="append", default=[], help="SHAPE=DIR: Medusa heads trained on that target")
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--train-steps", type=int, default=0, help="also time N build-recipe training steps per shape")
    parser.add_argument("--out", help="folder for results.json and results.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = args.shapes.split(",")
    heads = dict(h.split("=", 1) for h in args.heads)

    loaded = {s: load_shape(s) for s in shapes}
    probes = {s: CostProbe(m, args.context) for s, (m, _, _) in loaded.items()}
    costs = measure_costs(probes, args.rounds)
    rows = {}
    for s, (model, tok, meta) in loaded.items():
        row = {"shape": s, "built": meta is not None, "parameters": sum(p.numel() for p in model.parameters()),
               **costs[s]}
        if args.train_steps:
            row["train_cpu_ms_per_token"] = train_cpu_ms_per_token(s, args.train_steps)
        if meta is not None:
            row.update(heldout_loss=meta["heldout_loss"], tokens_trained=meta["tokens_trained"],
                       build_seconds=meta["wall_time_s"], train_tokens_per_second=meta["train_tokens_per_second"],
                       build_key=meta["build_key"])
            prompts = heldout_prompts(tok, args.prompts, args.prompt_tokens)
            row.update(quality(model, tok, prompts, args.new_tokens, heads.get(s)))
        rows[s] = row
        print(json.dumps(row))

    lines = [
        "| shape | params | built | held-out loss | distinct 4-grams | 1-token forward ms | per layer ms | "
        "16-token verify / 1 | EAGLE ms per depth (full / 512 vocab) | as share of a forward |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, r in rows.items():
        e = r["eagle"]
        lines.append(
            f"| {s} | {r['parameters'] / 1e6:.2f} M | {'yes' if r['built'] else 'random weights'} | "
            f"{r.get('heldout_loss', float('nan')):.3f} | {r.get('distinct_4grams', float('nan')):.2f} | "
            f"{r['forward_ms']:.2f} | {r['per_layer_ms']:.3f} | {r['verify16_ms']:.2f} / {r['verify1_ms']:.2f} = "
            f"{r['verify_ratio']:.2f}x | {e['full']['per_depth_ms']:.2f} / {e['512']['per_depth_ms']:.2f} | "
            f"{e['full']['per_depth_vs_forward']:.2f} / {e['512']['per_depth_vs_forward']:.2f} |"
        )
    offsets = [(s, r["offset_top1"]) for s, r in rows.items() if "offset_top1" in r]
    if offsets:
        lines += ["", "Medusa head top-1 vs the token j ahead (head k is trained for offset k+2):", "",
                  "| shape | head | +1 | +2 | +3 | +4 |", "|---|---|---|---|---|---|"]
        for s, table in offsets:
            for k, row in enumerate(table):
                lines.append(f"| {s} | {k} | " + " | ".join(f"{a:.2f}" for a in row) + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        env = {"threads": args.threads, "context": args.context, "rounds": args.rounds, "torch": torch.__version__}
        (out / "results.json").write_text(json.dumps({"args": vars(args), "env": env, "shapes": rows}, indent=2) + "\n")
        (out / "results.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
