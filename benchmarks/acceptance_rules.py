"""Accepted tokens per step under sampling, per acceptance rule and per way of drafting a chain.

    python benchmarks/acceptance_rules.py --medusa runs/medusa/heads --eagle runs/eagle/heads \\
        [--temperatures 0.7,1.0] [--num-prompts 12] [--new-tokens 64] [--depth 3] [--out DIR]

For each head type, a CHAIN of ``--depth`` drafts is decoded two ways:
- ``topk``: each draft is the head's best token (a point mass; how the library drafts today);
- ``sampled``: each draft is SAMPLED from the head's distribution (processed with the request's
  temperature/top-k/top-p), its law carried in ``Tree.draft_probs`` for the verifier;
and each is verified by every lossless rule (``exact``: token by token / recursive rejection;
``block``: block verification). No timing: only accepted tokens per step (new tokens / target
forwards), which the machine's load does not change. Every (prompt, temperature, variant) uses the
same seed, the draft budget and batch plan are off so every step drafts the full chain.

The demo target's held-out code prompts (`draftheads.bench.questions.demo_questions`), top-k and
top-p off (as plain `generate(do_sample=True, top_k=0)` would sample).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import draftheads as dh
from draftheads.bench.questions import demo_questions
from draftheads.target import load_target
from draftheads.inference.proposers.base import Proposer
from draftheads.inference.proposers.eagle import EagleProposer
from draftheads.inference.proposers.medusa import MedusaProposer
from draftheads.inference.proposers.row_base import ForkedRows
from draftheads.inference.sampling import sample
from draftheads.inference.tree import Tree, TreeShape

RULES = ("exact", "block")


class SampledMedusaChain(MedusaProposer):
    """Medusa heads drafting a chain by SAMPLING head k's token from its processed distribution
    (head k predicts position k + 1 from the same hidden state, so its law does not depend on the
    drafts before it): a valid proposal law q, which the verifier receives."""

    def start(self, input_ids, hidden, params, generator) -> None:
        super().start(input_ids, hidden, params, generator)
        self._params, self._generator = params, generator

    @torch.no_grad()
    def propose(self, root: int, max_depth: int) -> Tree:
        shape, _, _, _, used = self._layout(max_depth)
        if shape.size == 1:
            return Tree(shape, torch.tensor([root]))
        states = self.heads.head_states(self._last_hidden.to(self.heads_device))
        rows = []
        for k in range(used):
            weight, bias = self._projections[k]
            logits = torch.nn.functional.linear(states[k].to(weight.dtype), weight, bias)
            q = self._params.probs(logits)
            if self.vocab_ids is not None:
                q = torch.zeros(self.heads.config.vocab_size, device=q.device).index_copy(0, self.vocab_ids, q)
            rows.append(q)
        drafts = [sample(q, self._generator) for q in rows]
        laws = torch.stack([torch.zeros_like(rows[0]), *rows])
        return Tree(shape, torch.tensor([root, *drafts]), laws)

    def rows(self, compaction: str = "auto"):
        return ForkedRows(self)


class SampledEagleChain(EagleProposer):
    """EAGLE drafting a chain by SAMPLING each level's token from the draft layer's processed
    distribution (the next level sees the sampled token). EAGLE's own growth with top_k=1 runs the
    draft layer; its scoring callable samples and records each level's law."""

    def start(self, input_ids, hidden, params, generator) -> None:
        super().start(input_ids, hidden, params, generator)
        self._params, self._generator = params, generator
        if not hasattr(self, "_score"):
            self._score = self._logits
            self._logits = self._sampling_logits

    def _sampling_logits(self, state: torch.Tensor) -> torch.Tensor:
        logits = self._score(state).float()
        q = self._params.probs(logits.reshape(-1, logits.shape[-1]))[0]
        x = sample(q, self._generator)
        self._laws.append(q)
        picked = torch.full_like(logits, -1e9)
        picked[..., x] = 0.0  # topk(1) in the growth picks the sampled token
        return picked

    @torch.inference_mode()
    def propose(self, root: int, max_depth: int) -> Tree:
        self._laws = []
        tree = super().propose(root, max_depth)
        if tree.shape.size == 1:
            return tree
        laws = torch.stack(self._laws[: tree.shape.size - 1])
        if self.vocab_ids is not None:
            full = torch.zeros(laws.shape[0], self.head.config.vocab_size, device=laws.device)
            laws = full.index_copy(1, self._vocab_ids_dev, laws)
        return Tree(tree.shape, tree.tokens, torch.cat([torch.zeros_like(laws[:1]), laws]))

    def rows(self, compaction: str = "auto"):
        return ForkedRows(self)


def proposers(args, target) -> dict[str, Proposer]:
    found = {}
    if args.medusa:
        heads = dh.load_heads(args.medusa, target)
        chain = TreeShape.chain(args.depth)
        found["medusa topk"] = MedusaProposer(heads, tree=chain)
        found["medusa sampled"] = SampledMedusaChain(heads, tree=chain)
    if args.eagle:
        head = dh.load_heads(args.eagle, target)
        vocab = (head.tree or {}).get("draft_vocab_size") if isinstance(head.tree, dict) else None
        chain = dict(total_tokens=args.depth + 1, depth=args.depth, top_k=1, draft_vocab_size=vocab)
        found["eagle topk"] = EagleProposer(head, **chain)
        found["eagle sampled"] = SampledEagleChain(head, **chain)
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--medusa", help="Medusa heads folder")
    parser.add_argument("--eagle", help="EAGLE heads folder")
    parser.add_argument("--target", default="demo")
    parser.add_argument("--temperatures", default="0.7,1.0")
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--depth", type=int, default=3, help="drafts per chain (the heads' depth)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="folder for results.json")
    parser.add_argument("--skip-equal", action="store_true",
                        help="skip block verification of top-k (point-mass) chains, equal in law to exact")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    target, tokenizer = load_target(args.target)
    prompts = [tokenizer(q.turns[0], return_tensors="pt").input_ids for q in demo_questions(tokenizer, args.num_prompts)]
    decoders = {name: dh.SpeculativeDecoder(target, p, batch_plan=None, draft_budget=None)
                for name, p in proposers(args, target).items()}
    temps = [float(t) for t in args.temperatures.split(",")]
    results = []
    t0 = time.time()
    for i, ids in enumerate(prompts):
        for temp in temps:  # interleaved: every temperature and variant on the same prompt in turn
            for name, decoder in decoders.items():
                for rule in RULES:
                    if args.skip_equal and name.endswith("topk") and rule == "block":
                        continue  # point-mass drafts: block and token-by-token accept alike, in law
                    out = decoder.generate(ids, max_new_tokens=args.new_tokens, temperature=temp, top_k=0, top_p=1.0,
                                           eos_token_id=[], seed=args.seed * 1000 + i, acceptance=rule)
                    results.append({"temperature": temp, "prompt": i, "variant": name, "rule": rule,
                                    "new_tokens": out.stats["new_tokens"], "steps": out.stats["steps"]})
            print(f"T={temp} prompt {i + 1}/{len(prompts)} done ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
            save(args.out, args, results)  # after every prompt: a long run stopped early keeps its figures
    table = summarise(results, temps, list(decoders))
    print(table)
    if args.out:
        (Path(args.out) / "table.md").write_text(table + "\n")


def save(folder: str | None, args, results: list[dict]) -> None:
    if folder:
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"args": vars(args), "runs": results}, indent=1))


def summarise(results: list[dict], temps: list[float], variants: list[str]) -> str:
    """Accepted tokens per step (new tokens / steps over all prompts), and the per-prompt spread."""
    lines = ["| drafts | rule | " + " | ".join(f"T={t}: tokens/step (per-prompt min-max)" for t in temps) + " |",
             "|---|---|" + "---|" * len(temps)]
    for variant in variants:
        for rule in RULES:
            cells = []
            for t in temps:
                rows = [r for r in results if r["variant"] == variant and r["rule"] == rule and r["temperature"] == t]
                if not rows:
                    cells.append("-")
                    continue
                per = [r["new_tokens"] / r["steps"] for r in rows]
                total = sum(r["new_tokens"] for r in rows) / sum(r["steps"] for r in rows)
                cells.append(f"{total:.3f} ({min(per):.2f}-{max(per):.2f}, median {statistics.median(per):.2f})")
            lines.append(f"| {variant} | {rule} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
