"""Speculation on a small HYBRID target on this machine: what recording and rolling back the recurrent
state costs, chains against trees at equal verify tokens, and the speed against plain ``generate``.

No hybrid model installs from PyPI, so the target is built here from transformers' own config (default:
Qwen3.5's layout, 3 Gated DeltaNet layers to 1 attention layer, 8 layers x 256 wide; or ``--family
nemotron_h``: Mamba-2, attention and MLP blocks) and pretrained for ``--pretrain-steps`` on Python's
standard library (every machine has it; a byte-level BPE of ``--vocab`` tokens trained on it): a random
model's greedy text is a random walk no heads can learn, a briefly trained one writes (weak) code.
Its heads (EAGLE-3, one layer) are trained on the target's own greedy continuations of training-file
windows, as the main job trains on what the target writes; held-out prompts come from other files.
The pretrained target (with its tokenizer) and the heads are kept in ``--out``/target and ``--out``/heads and
reused by a later run into the same folder (to measure again on a quieter machine).

1. **Cost of one verify forward** over a ``--context``-token cache, interleaved round by round (medians,
   ms and as a multiple of a one-token forward): a chain of n tokens as the verifier runs it (transformers'
   past recording: every layer's one-token kernel per token, each state kept), the same n tokens through a
   bare forward (the chunked kernels, nothing kept: what no rollback costs), the same chain through the
   tree scan (one pass of each recurrent layer per token), a bushy tree of n nodes (the scan, one pass per
   level), and ``recurrent.commit_states`` (the rollback itself: a slot choice). The rollback cost of a
   chain is (recorded - bare forward + commit) / one-token forward, round by round (median, quartiles).
   ``--costs-only`` runs this part alone on an untrained target of the layout.
2. **Tokens per step**, greedy, for chains and trees of equal verify tokens (2, 4, 8), each output
   checked against ``generate``: EAGLE-2 trees as deep as the chain (`TREES`), shallower and wider ones,
   each ranked by joint draft probability and again by the heads' confidence table (`heads.confidence`,
   measured here on ``--confidence-prompts`` training windows, as ``draftheads calibrate`` measures it).
3. **Speed**: plain ``generate``, the best chain, the best tree and prompt lookup, interleaved per prompt;
   tokens/s ratio against plain (the sum over prompts) with the per-prompt median and range.

    python benchmarks/hybrid_targets.py --family qwen3_5_text --threads 2 --out results/hybrid-qwen3_5
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the tiny hybrid builder the tests use

import draftheads as dh  # noqa: E402
from draftheads.atomic import write_text_atomically  # noqa: E402
from draftheads.bench.metrics import spread  # noqa: E402
from draftheads.device import device_name  # noqa: E402
from draftheads.inference.proposers.drawn_trees import drawn_tree_tokens  # noqa: E402
from draftheads.inference.recurrent import commit_states, keep_prefix  # noqa: E402
from draftheads.inference.tree import Tree, TreeShape  # noqa: E402
from draftheads.inference.verify import TreeVerifier  # noqa: E402
from draftheads.tune.calibrate import calibrate_confidence  # noqa: E402
from hybrid_utils import tiny_hybrid  # noqa: E402
from report_files import write_report  # noqa: E402

PROMPT = 16


def build_target(family: str, layers: int, hidden: int, vocab: int) -> torch.nn.Module:
    if layers % 4:
        raise SystemExit(f"--layers {layers}: a multiple of 4 (the families' pattern repeats every 4 layers)")
    over: dict = dict(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=3 * hidden, vocab_size=vocab,
                      init=0.02, head_dim=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "qwen3_5_text":
        over.update(layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (layers // 4),
                    linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4)
    elif family == "nemotron_h":
        over.update(hybrid_override_pattern="M-M*" * (layers // 4), mamba_head_dim=32, mamba_num_heads=hidden // 32,
                    ssm_state_size=16)
    else:
        raise SystemExit(f"--family {family!r}: qwen3_5_text or nemotron_h")
    return tiny_hybrid(family, **over)


def stdlib_texts() -> tuple[list[str], list[str]]:
    """The running Python's standard library sources, split into train / held-out files by a hash of the
    path (5% held out)."""
    import hashlib
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        (held if hashlib.sha256(str(path.relative_to(root)).encode()).digest()[0] < 13 else train).append(text)
    return train, held


def tokenizer_for(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<pad>", "<s>", "</s>"],
                                                       show_progress=False))
    return tok


def pretrained_target(args, out: Path):
    """The target, pretrained on the standard library (or read back from ``out``/target)."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    folder = out / "target"
    train, held = stdlib_texts()
    if (folder / "model.safetensors").is_file():
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        return target, tok, train, held, {"reused": str(folder)}
    tok = tokenizer_for(train, args.vocab)
    target = build_target(args.family, args.layers, args.hidden, tok.get_vocab_size())
    ids = torch.tensor([t for text in train for t in tok.encode(text).ids], dtype=torch.long)
    window, batch = args.window, 8
    opt = torch.optim.AdamW(target.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.pretrain_steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(1)
    target.train()
    t0, losses = time.perf_counter(), []
    for _ in range(args.pretrain_steps):
        starts = torch.randint(0, len(ids) - window - 1, (batch,), generator=gen)
        rows = torch.stack([ids[s : s + window] for s in starts.tolist()])
        loss = target(input_ids=rows, labels=rows).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if len(losses) % 25 == 0:
            print(f"pretraining: step {len(losses)}/{args.pretrain_steps}, loss {statistics.mean(losses[-25:]):.2f}, "
                  f"{(time.perf_counter() - t0) / len(losses):.1f} s/step", file=sys.stderr, flush=True)
    target.eval().requires_grad_(False)
    folder.mkdir(parents=True, exist_ok=True)
    target.save_pretrained(folder)
    save_tokenizer(tok, folder)
    return target, tok, train, held, {"steps": args.pretrain_steps, "tokens": args.pretrain_steps * batch * window,
                                      "corpus_tokens": len(ids), "seconds": time.perf_counter() - t0,
                                      "first_loss": losses[0], "last_loss": statistics.mean(losses[-20:])}


def save_tokenizer(tok, folder: Path) -> None:
    """The BPE as a transformers tokenizer in the target folder, so that ``draftheads calibrate`` loads
    the target as users' targets are loaded."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(folder)


def windows(tok, texts: list[str], count: int, length: int, seed: int) -> torch.Tensor:
    """``count`` token windows of ``length`` from random places in ``texts``."""
    gen = torch.Generator().manual_seed(seed)
    encoded = [tok.encode(t).ids for t in texts]
    encoded = [e for e in encoded if len(e) > length + 1]
    rows = []
    for _ in range(count):
        e = encoded[int(torch.randint(0, len(encoded), (1,), generator=gen))]
        start = int(torch.randint(0, len(e) - length, (1,), generator=gen))
        rows.append(e[start : start + length])
    return torch.tensor(rows, dtype=torch.long)


def train_heads(target, seqs: torch.Tensor, steps: int, batch: int, seed: int = 0):
    """EAGLE-3 heads on the target's own continuations (train.py's loss, a plain AdamW loop)."""
    from draftheads.train.model import TargetWithHeads

    torch.manual_seed(seed)
    vocab = target.config.vocab_size
    heads = dh.Eagle3Head.for_target(target, num_heads=3, num_layers=1, draft_vocab_size=min(2048, vocab))
    heads.set_draft_vocab(torch.bincount(seqs.flatten(), minlength=vocab))
    model = TargetWithHeads(target, heads)
    opt = torch.optim.AdamW(heads.parameters(), lr=2e-3, betas=(0.9, 0.95))
    mask = torch.zeros_like(seqs)
    mask[:, PROMPT:] = 1
    gen = torch.Generator().manual_seed(seed)
    t0, losses = time.perf_counter(), []
    for _ in range(steps):
        rows = torch.randint(0, seqs.shape[0], (batch,), generator=gen)
        loss = model(seqs[rows], loss_mask=mask[rows])["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return heads.eval(), {"steps": steps, "seconds": time.perf_counter() - t0, "first_loss": losses[0],
                          "last_loss": statistics.mean(losses[-10:])}


def calibrated_plan(out: Path, tok, texts: list[str], args) -> dict:
    """``draftheads calibrate`` on the target and heads folders, as a user runs it (its prompts:
    beginnings of held-out files, raw text), and the batch-1 greedy entry it saved in tree.json."""
    import subprocess

    prompts = windows(tok, texts, args.plan_prompts, 64, seed=4)
    prompt_file = out / "plan_prompts.txt"
    write_text_atomically(prompt_file, "".join(tok.decode(row.tolist()).replace("\n", " ") + "\n" for row in prompts))
    command = [sys.executable, "-m", "draftheads.cli", "calibrate", "--target", str(out / "target"), "--heads",
               str(out / "heads"), "--prompts", str(prompt_file), "--no-chat-template", "--num-prompts",
               str(args.plan_prompts), "--new-tokens", str(args.new_tokens), "--device", "cpu"]
    t0 = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    plans = json.loads((out / "heads" / "tree.json").read_text())
    entries = [e for e in plans.get("plans", []) if e.get("batch_size") == 1 and not e.get("temperature")]
    return {"seconds": time.perf_counter() - t0, "entry": entries[0] if entries else None}


#: Chains and EAGLE-2 trees of equal verify tokens (2, 4, 8). A tree as deep as the chain keeps the n
#: nodes of highest joint draft probability among two children per node: the chain itself where the
#: heads are sure of every top-1 draft, a branch where a second choice is likelier than a deeper first.
TREES = {f"{kind}-{n}": {"total_tokens": n, "depth": n - 1, "top_k": 1 if kind == "chain" else 2}
         for n in (2, 4, 8) for kind in ("chain", "tree")}
#: Shallower, wider trees of the same sizes (what an earlier run of this benchmark compared alone), and
#: the top-3 tree five deep that ``draftheads calibrate`` times at 8 tokens on a CPU.
SHALLOW_TREES = {"shallow-4": {"total_tokens": 4, "depth": 2, "top_k": 2},
                 "shallow-8": {"total_tokens": 8, "depth": 3, "top_k": 3},
                 "wide-8": {"total_tokens": 8, "depth": 5, "top_k": 3}}
#: The kinds of tree part 2 compares against the chain, in the table's order.
TREE_KINDS = ("tree", "shallow", "wide")


def bushy(n: int) -> TreeShape:
    """n nodes, up to three children per node (what calibrate times a tree size with)."""
    return TreeShape(tuple([-1] + [max(0, (i - 1) // 3) for i in range(1, n)]))


@torch.no_grad()
def verify_costs(target, sizes: list[int], context: int, rounds: int) -> dict:
    """Medians (ms) of each kind of forward, interleaved round by round over one cache."""
    verifier = TreeVerifier(target)
    vocab = target.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = verifier.new_cache()
    target(input_ids=torch.randint(3, vocab, (1, context), generator=gen), cache=cache, use_cache=True)
    layout = verifier.recurrent

    kinds: dict[str, dict[int, list[float]]] = {k: {n: [] for n in sizes} for k in
                                                ("recorded chain", "bare forward", "scanned chain", "tree", "commit")}
    one: list[float] = []
    for r in range(rounds + 2):  # two warm-up rounds
        tokens = {n: torch.randint(3, vocab, (n,), generator=gen) for n in sizes}
        saved = _snapshot(cache, layout)  # a one-token forward advances the state in place: undone after
        t0 = time.perf_counter()
        target(input_ids=torch.randint(3, vocab, (1, 1), generator=gen), cache=cache, use_cache=True,
               position_ids=torch.tensor([[context]]))
        if r >= 2:
            one.append(time.perf_counter() - t0)
        _restore(cache, layout, saved)
        keep_prefix(cache, context)
        for n in sizes:
            runs = {
                "recorded chain": lambda: verifier.forward_tree(cache, Tree(TreeShape.chain(n - 1), tokens[n]), context),
                "bare forward": lambda: _bare(target, cache, tokens[n], context, layout),
                "scanned chain": lambda: _scanned_chain(verifier, cache, tokens[n], context),
                "tree": lambda: verifier.forward_tree(cache, Tree(bushy(n), tokens[n]), context),
            }
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for name in order:
                t0 = time.perf_counter()
                result = runs[name]()
                seconds = time.perf_counter() - t0
                if name == "recorded chain":  # the rollback: keep the first half of the chain
                    step = result[3]
                    t1 = time.perf_counter()
                    saved = _snapshot(cache, layout)
                    commit_states(cache, step, [max(0, n // 2 - 1)], max(1, n // 2))
                    commit_seconds = time.perf_counter() - t1
                    _restore(cache, layout, saved)
                    if r >= 2:
                        kinds["commit"][n].append(commit_seconds)
                keep_prefix(cache, context)
                if r >= 2:
                    kinds[name][n].append(seconds)
    base = statistics.median(one)
    table = {name: {n: 1e3 * statistics.median(xs) for n, xs in by_n.items()} for name, by_n in kinds.items()}
    # each round's own (recorded - bare + commit) / one-token: the forwards of one round ran back to back,
    # so a slow stretch of the machine moves both sides of the difference
    paired = {n: sorted((rec - bare + commit) / o for rec, bare, commit, o in
                        zip(kinds["recorded chain"][n], kinds["bare forward"][n], kinds["commit"][n], one))
              for n in sizes}
    return {"one_token_ms": 1e3 * base, "ms": table, "context": context, "rounds": rounds,
            "rollback_share_of_one_token": {n: statistics.median(xs) for n, xs in paired.items()},
            "rollback_share_quartiles": {n: (spread(xs)["q1"], spread(xs)["q3"]) for n, xs in paired.items()},
            "rollback_share_rounds": paired,
            "commit_share_of_one_token": {n: table["commit"][n] / (1e3 * base) for n in sizes}}


def _snapshot(cache, layout) -> dict:
    return {i: ({s: t.clone() for s, t in cache.layers[i].conv_states.items() if t is not None},
                {s: t.clone() for s, t in cache.layers[i].recurrent_states.items() if t is not None},
                cache.layers[i].cumulative_length_linear.clone()) for i in layout.layers}


def _restore(cache, layout, saved: dict) -> None:
    for i, (conv, rec, count) in saved.items():
        layer = cache.layers[i]
        for s, t in conv.items():
            layer.conv_states[s] = t
        for s, t in rec.items():
            layer.recurrent_states[s] = t
        layer.cumulative_length_linear.copy_(count)


def _bare(target, cache, tokens: torch.Tensor, context: int, layout) -> None:
    """The model's own multi-token forward (chunked kernels), nothing recorded; its state advance is undone."""
    saved = _snapshot(cache, layout)
    target(input_ids=tokens[None], cache=cache, use_cache=True,
           position_ids=torch.arange(context, context + len(tokens))[None])
    _restore(cache, layout, saved)


def _scanned_chain(verifier, cache, tokens: torch.Tensor, context: int) -> None:
    """A chain verified through the tree scan (one recurrent pass per token) instead of past recording."""
    n = len(tokens)
    # a chain plus one extra leaf on the root: not a chain, so the scan runs; n + 1 tokens in all
    shape = TreeShape((-1, *range(n - 1), 0))
    verifier.forward_tree(cache, Tree(shape, torch.cat([tokens, tokens[:1]])), context)


@torch.no_grad()
def acceptance(target, heads, prompts: torch.Tensor, new: int, trees: dict[str, dict], temperature: float = 0.0,
               seed: int = 0, drawn: bool = False) -> dict:
    """Tokens per step of each tree over the held-out prompts: greedy, every output checked against
    ``generate``, or sampled at ``temperature`` (top-k 50, transformers' default; the same seed for every
    tree), whose law the tests check (`test_sampling_keeps_the_target_law_on_a_hybrid`). Sampled, a chain
    is drawn from the heads' distribution (the decoder's default) and a tree keeps its top-k candidates
    (``draw_drafts=False``), or with ``drawn`` is drawn too (siblings without replacement, in the shape
    fitted to their acceptance so far: `drawn_trees`, the decoder's default)."""
    target.generation_config.eos_token_id = None
    want = None if temperature else target.generate(
        prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=new, min_new_tokens=new)
    out = {}
    for name, tree in trees.items():
        decoder = dh.SpeculativeDecoder(target, heads, tree=tree, draft_budget=None, batch_plan=None,
                                        prompt_lookup=False, draw_drafts=drawn or tree["top_k"] == 1)
        steps = tokens = 0
        for r in range(prompts.shape[0]):
            sampled = {"temperature": temperature, "top_k": 50, "seed": seed + r} if temperature else {}
            got = decoder.generate(prompts[r : r + 1], max_new_tokens=new, eos_token_id=[], **sampled)
            if want is not None and got.sequences[0].tolist() != want[r].tolist():
                raise AssertionError(f"{name}: prompt {r} differs from generate")
            steps += len(got.accept_lengths)
            tokens += sum(got.accept_lengths)
        out[name] = {"tree": tree, "tokens_per_step": tokens / steps}
    return out


@torch.no_grad()
def speed(target, heads, prompts: torch.Tensor, new: int, methods: dict[str, dict | str | tuple], rounds: int) -> dict:
    """Seconds per method and prompt, interleaved with plain generate (alternating order per round)."""
    decoders = {}
    for name, how in methods.items():
        if how == "lookup":
            decoders[name] = dh.SpeculativeDecoder(target, dh.PromptLookupProposer(), batch_plan=None)
        elif isinstance(how, tuple):  # ("plan", heads read back with their tree.json): what a user gets
            decoders[name] = dh.SpeculativeDecoder(target, how[1])
        else:
            decoders[name] = dh.SpeculativeDecoder(target, heads, tree=how, batch_plan=None, prompt_lookup=False)
    seconds = {name: [0.0] * prompts.shape[0] for name in ["plain", *decoders]}
    for rnd in range(rounds + 1):  # round 0 warms up
        for r in range(prompts.shape[0]):
            ids = prompts[r : r + 1]
            order = ["plain", *decoders] if (rnd + r) % 2 == 0 else ["plain", *decoders][::-1]
            for name in order:
                t0 = time.perf_counter()
                if name == "plain":
                    target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                                    min_new_tokens=new)
                else:
                    decoders[name].generate(ids, max_new_tokens=new, eos_token_id=[])
                if rnd:
                    seconds[name][r] += time.perf_counter() - t0
    plain = seconds.pop("plain")
    return {name: {"speedup": sum(plain) / sum(xs),
                   "per_prompt": {"median": statistics.median(p / x for p, x in zip(plain, xs)),
                                  "min": min(p / x for p, x in zip(plain, xs)),
                                  "max": max(p / x for p, x in zip(plain, xs))}}
            for name, xs in seconds.items()}


def share_cell(costs: dict, n: int) -> str:
    """The rollback share at ``n`` tokens as a percentage, with its quartiles where they were kept."""
    share = f"{100 * costs['rollback_share_of_one_token'][n]:.1f}%"
    q = costs.get("rollback_share_quartiles", {}).get(n)
    return share if q is None else f"{share} ({100 * q[0]:.1f} to {100 * q[1]:.1f})"


def costs_markdown(report: dict) -> list[str]:
    """The verify-cost table of ``report``."""
    c = report["costs"]
    sizes = sorted(c["ms"]["recorded chain"])
    lines = [f"One verify forward over a {c['context']}-token cache, medians of {c['rounds']} interleaved rounds "
             f"(one-token forward {c['one_token_ms']:.1f} ms = 1.00):", "",
             "| tokens | recorded chain (the verifier) | bare forward (no rollback possible) | chain through the tree scan "
             "| bushy tree (the scan) | commit (rollback) | rollback as a share of one token (round by round: "
             "median, quartiles) |", "|---|---|---|---|---|---|---|"]
    one = c["one_token_ms"]
    for n in sizes:
        ms = {k: c["ms"][k][n] for k in c["ms"]}
        lines.append(f"| {n} | {ms['recorded chain'] / one:.2f} | {ms['bare forward'] / one:.2f} | "
                     f"{ms['scanned chain'] / one:.2f} (n+1 nodes) | {ms['tree'] / one:.2f} | {ms['commit']:.2f} ms | "
                     f"{share_cell(c, n)} |")
    return lines


def acceptance_markdown(report: dict) -> list[str]:
    """Part 2's table: tokens per step greedy and, where measured, sampled; each tree ranked by joint
    draft probability, then by the confidence table (a -> b)."""
    sampled = report.get("acceptance_sampled")
    t = f"T = {report['sampled_temperature']:g}" if sampled else None
    conf = report.get("confidence", {}).get("measured_on") or {}
    lines = ["Tokens per step on the held-out prompts (greedy: every output equal to `generate`"
             + (f"; {t}: sampled, top-k 50, the same seeds for every tree, chains drawn from the heads' "
                "distribution" if sampled else "") + "). The trees are "
             "EAGLE-2's: as deep as the chain (top 2 per node, n nodes kept), shallow (depth 2 / 3, top 2 / 3) and "
             "wide (depth 5, top 3). A tree cell a -> b (greedy) is its nodes ranked by joint draft probability "
             "(EAGLE-2), then by the heads' confidence table (the measured chance of acceptance by rank and draft "
             f"probability, `heads.confidence`, from {conf.get('roots', '?')} roots of the target's own text):", "",
             "| verify tokens | chain | " + " | ".join(TREE_KINDS) + " |"
             + "".join(f" {k}, {t} |" for k in ("chain", *TREE_KINDS) if sampled),
             "|---|---|" + "---|" * len(TREE_KINDS) + ("---|" * (1 + len(TREE_KINDS)) if sampled else "")]

    def cells(acc: dict, ranked: dict, n: int) -> str:
        out = [f"{acc[f'chain-{n}']['tokens_per_step']:.2f}"]
        for kind in TREE_KINDS:
            k = f"{kind}-{n}"
            out.append(f"{acc[k]['tokens_per_step']:.2f} -> {ranked[k]['tokens_per_step']:.2f}" if k in ranked
                       else f"{acc[k]['tokens_per_step']:.2f}" if k in acc else "-")
        return " | ".join(out)

    for n in (2, 4, 8):
        row = f"| {n} | {cells(report['acceptance'], report.get('acceptance_ranked', {}), n)} |"
        if sampled:
            row += f" {cells(sampled, report.get('acceptance_drawn', {}), n)} |"
        lines.append(row)
    if report.get("acceptance_drawn"):
        lines += ["", f"A tree cell a -> b at {t} is the tree of top-k candidates, then the same settings DRAWN: "
                  "siblings drawn without replacement from the heads' law, in the shape fitted to how often each "
                  "sibling rank was accepted so far (`inference.proposers.drawn_trees`, the decoder's default when "
                  "sampling). A drawn tree verifies as many tokens as a drawn chain as deep (depth + 1), so only the "
                  "trees as deep as their budget are drawn here."]
    return lines


def markdown(report: dict) -> str:
    pre = report["pretraining"]
    trained = (f"pretrained {pre['steps']} steps ({pre['tokens'] / 1e6:.1f} M tokens of the standard library, loss "
               f"{pre['first_loss']:.2f} -> {pre['last_loss']:.2f})" if "steps" in pre else f"read back from {pre['reused']}")
    lines = [f"Target: a {report['family']} ({report['layers']} layers x {report['hidden']}, vocab "
             f"{report['vocab']}, layer types {', '.join(dict.fromkeys(report['layer_types']))}; {trained}); {report['machine']}, "
             f"{report['threads']} threads, fp32; {report['date']}. Heads: EAGLE-3 " + (
                 f"trained {report['training']['steps']} steps on the target's own greedy continuations (loss "
                 f"{report['training']['first_loss']:.2f} -> {report['training']['last_loss']:.2f})."
                 if "steps" in report["training"] else f"read back from {report['training']['reused']}."), "",
             *costs_markdown(report)]
    lines += ["", *acceptance_markdown(report)]
    entry = (report.get("plan") or {}).get("entry")
    if entry is not None:
        shown = {k: entry[k] for k in ("mode", "tree", "draft_vocab_size", "prompt_lookup") if k in entry}
        lines += ["", f"The plan `draftheads calibrate` chose here (batch 1, greedy): `{json.dumps(shown)}`"]
    lines += ["", "Speed against plain `generate`, interleaved per prompt (sum over prompts; per-prompt median, range):",
              "", "| method | speedup | per prompt |", "|---|---|---|"]
    for name, s in report["speed"].items():
        p = s["per_prompt"]
        lines.append(f"| {name} | {s['speedup']:.2f}x | {p['median']:.2f}x ({p['min']:.2f}-{p['max']:.2f}) |")
    return "\n".join(lines) + "\n"


def costs_only(args, out: Path) -> None:
    """Part 1 alone, on an untrained target of the layout: written to ``out``/costs.{json,md}."""
    target = build_target(args.family, args.layers, args.hidden, args.vocab).eval()
    report = {"family": args.family, "layers": args.layers, "hidden": args.hidden, "vocab": args.vocab,
              "machine": f"{device_name(torch.device('cpu'))} ({platform.machine()})", "threads": args.threads,
              "date": time.strftime("%Y-%m-%d"), "costs": verify_costs(target, [2, 4, 8], args.context, args.rounds)}
    text = "\n".join([f"Target: an untrained {args.family} ({args.layers} layers x {args.hidden}, vocab {args.vocab}); "
                      f"{report['machine']}, {args.threads} threads, fp32; {report['date']}.", "",
                      *costs_markdown(report)]) + "\n"
    write_report(out, args, report, text, stem="costs")


def tokens_per_step(target, heads, held: torch.Tensor, confidence_prompts: list[torch.Tensor], args) -> dict:
    """Part 2: every tree greedy, ranked by joint draft probability (EAGLE-2) and again by the heads'
    confidence table (measured here as `draftheads calibrate` measures it, on the target's
    continuations of ``confidence_prompts``: the chance of acceptance by rank and draft probability,
    `heads.confidence`); with ``--sampled-temperature``, every tree sampled (ranked by draft
    probability, as the decoder ranks sampled trees)."""
    trees = {**TREES, **SHALLOW_TREES}
    branching = {k: t for k, t in trees.items() if t["top_k"] > 1}  # a chain ranks nothing
    t0 = time.perf_counter()
    table = calibrate_confidence(target, heads, confidence_prompts, new_tokens=args.new_tokens)
    report = {"confidence": {**table.to_json(), "seconds": time.perf_counter() - t0}}
    heads.confidence = None
    report["acceptance"] = acceptance(target, heads, held, args.new_tokens, trees)
    heads.confidence = table  # from here on, as a calibrated heads folder decodes
    report["acceptance_ranked"] = acceptance(target, heads, held, args.new_tokens, branching)
    if args.sampled_temperature:  # sampled trees keep EAGLE-2's ranking (the table holds greedy hits)
        report["sampled_temperature"] = args.sampled_temperature
        report["acceptance_sampled"] = acceptance(target, heads, held, args.new_tokens, trees, args.sampled_temperature)
        # Only the trees that draw their whole token budget (`drawn_tree_tokens`) are drawn at the row's width.
        full_width = {k: t for k, t in branching.items()
                      if drawn_tree_tokens(t["total_tokens"], t["depth"]) == t["total_tokens"]}
        report["acceptance_drawn"] = acceptance(target, heads, held, args.new_tokens, full_width,
                                                args.sampled_temperature, drawn=True)
    return report


def confidence_prompts(tok, train_texts: list[str], args) -> list[torch.Tensor]:
    """Windows of training files (not the held-out ones) the confidence table is measured on."""
    return list(windows(tok, train_texts, args.confidence_prompts, PROMPT, seed=5)[:, None])


def acceptance_only(args, out: Path, target, tok, train_texts: list[str], held_texts: list[str]) -> None:
    """Part 2 alone, on the target and heads an earlier run kept in ``out``: out/acceptance.{json,md}."""
    heads = dh.load_heads(out / "heads", target=target).eval()
    held = windows(tok, held_texts, args.eval_prompts, PROMPT, seed=3)
    report = tokens_per_step(target, heads, held, confidence_prompts(tok, train_texts, args), args)
    write_report(out, args, report, "\n".join(acceptance_markdown(report)) + "\n", stem="acceptance")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", default="qwen3_5_text")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--pretrain-steps", type=int, default=300)
    ap.add_argument("--window", type=int, default=128, help="pretraining window (tokens; batches of 8)")
    ap.add_argument("--train-prompts", type=int, default=96)
    ap.add_argument("--train-steps", type=int, default=200)
    ap.add_argument("--eval-prompts", type=int, default=12)
    ap.add_argument("--plan-prompts", type=int, default=8, help="prompts `draftheads calibrate` plans on")
    ap.add_argument("--confidence-prompts", type=int, default=16,
                    help="training windows the heads' confidence table is measured on (part 2)")
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--speed-rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sampled-temperature", type=float, default=1.0,
                    help="part 2 again, sampling at this temperature (0: greedy only)")
    ap.add_argument("--acceptance-only", action="store_true",
                    help="only part 2, on the target and heads an earlier run kept in --out")
    ap.add_argument("--costs-only", action="store_true",
                    help="only part 1, on an untrained target of the same layout (a forward's cost does not depend "
                         "on its weights' values): minutes instead of the pretraining's half hour")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    if args.costs_only:
        costs_only(args, out)
        return
    if args.acceptance_only and not ((out / "target" / "model.safetensors").is_file()
                                     and (out / "heads" / "config.json").is_file()):
        raise SystemExit(f"--acceptance-only: {out} holds no target and heads of an earlier run (run it once without)")
    target, tok, train_texts, held_texts, pretraining = pretrained_target(args, out)
    args.vocab = tok.get_vocab_size()
    if args.acceptance_only:
        acceptance_only(args, out, target, tok, train_texts, held_texts)
        return
    prompts = windows(tok, train_texts, args.train_prompts, PROMPT, seed=2)
    target.generation_config.eos_token_id = None
    with torch.no_grad():
        seqs = target.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False, max_new_tokens=64,
                               min_new_tokens=64, pad_token_id=0)
    if (out / "heads" / "config.json").is_file():  # heads of an earlier run on this target
        heads, training = dh.load_heads(out / "heads", target=target).eval(), {"reused": str(out / "heads")}
    else:
        heads, training = train_heads(target, seqs, args.train_steps, batch=8)
        heads.save_pretrained(out / "heads")
    held = windows(tok, held_texts, args.eval_prompts, PROMPT, seed=3)
    trees = {**TREES, **SHALLOW_TREES}
    report = {"family": args.family, "layers": args.layers, "hidden": args.hidden, "vocab": args.vocab,
              "layer_types": list(target.config.layer_types), "threads": args.threads,
              "machine": f"{device_name(torch.device('cpu'))} ({platform.machine()})",
              "date": time.strftime("%Y-%m-%d"), "training": training, "pretraining": pretraining}
    report["costs"] = verify_costs(target, [2, 4, 8], args.context, args.rounds)
    report.update(tokens_per_step(target, heads, held, confidence_prompts(tok, train_texts, args), args))
    # the best tree as ranked by the confidence table, which heads now carry (what calibrate saves)
    ranked = {**report["acceptance"], **report["acceptance_ranked"]}
    best = {kind: max((k for k in trees if k.startswith(prefixes)), key=lambda k: ranked[k]["tokens_per_step"])
            for kind, prefixes in (("chain", ("chain",)), ("tree", TREE_KINDS))}
    report["plan"] = calibrated_plan(out, tok, held_texts, args)
    planned = dh.load_heads(out / "heads", target=target).eval()  # with the tree.json calibrate wrote
    report["speed"] = speed(target, heads, held, args.new_tokens,
                            {f"best chain ({best['chain']})": trees[best["chain"]],
                             f"best tree ({best['tree']})": trees[best["tree"]], "prompt lookup": "lookup",
                             "the plan (draftheads calibrate)": ("plan", planned)},
                            args.speed_rounds)
    write_report(out, args, report, markdown(report))


if __name__ == "__main__":
    main()
