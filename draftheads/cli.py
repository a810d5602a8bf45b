"""`draftheads` command line.

    draftheads train --config configs/smollm2.yaml [key.sub=value ...]
    draftheads generate --target PATH_OR_ID --heads DIR --prompt "..."
    draftheads calibrate --target PATH_OR_ID --heads DIR [--prompts user|text|FILE] [--batch-sizes 1,4,8]
    draftheads bench --target PATH_OR_ID --heads DIR [--prompt-lookup] [--questions mt-bench|spec-bench|FILE] --out results/
    draftheads demo --target PATH_OR_ID --heads DIR             # plain vs the plan vs lookup alone, and why
    draftheads distill --target PATH_OR_ID --data FILE --out data/regen.jsonl [--engine hf|vllm] [--resume]
    draftheads cache-features --config CONFIG --out DIR [--dtype bfloat16]
    draftheads export HEADS OUT --format vllm|sglang|speculators
    draftheads import SRC OUT --target PATH_OR_ID

Every command imports torch and transformers only when it runs, so ``--help`` is instant.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .arguments import CommandError, batch_sizes, heads_error, positive_int
from .data.prompt_sets import DEFAULT_CALIBRATION_PROMPTS, describe_names


def _pick_device(requested: str | None):
    """``--device`` as a torch device, refused by name when torch cannot run on it here."""
    import torch

    from .device import default_device

    if not requested:
        return default_device()
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise CommandError(f"--device {requested!r} is not a device torch knows: use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise CommandError(
                f"--device {requested}: this torch ({torch.__version__}) cannot use CUDA (a CPU build, or no GPU is "
                "visible): pass --device cpu, or install a CUDA build of torch"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise CommandError(f"--device {requested}: only {torch.cuda.device_count()} GPU(s) are visible "
                               f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return device


def _load_heads(path: str, target, check_fingerprint: bool):
    """``dh.load_heads`` for a command: a folder that cannot be used is a `CommandError` naming it."""
    import draftheads as dh

    try:
        return dh.load_heads(path, target=target, check_fingerprint=check_fingerprint)
    except (ValueError, OSError) as e:  # missing, corrupt, NaN, another target's, a bad tree.json: all named
        raise heads_error(path, e) from None


def _check_prompt(ids, max_new_tokens: int, max_positions: int | None) -> None:
    """The encoded prompt fits: not empty, and with the new tokens within the model's positions."""
    n = int(ids.shape[1])
    if n == 0:
        raise CommandError("--prompt is empty (with --no-chat-template it is fed as it is): give some text")
    if max_positions is not None and n + max_new_tokens > max_positions:
        fix = (f"lower --max-new-tokens to {max_positions - n} or shorten the prompt" if n < max_positions
               else "shorten the prompt")
        raise CommandError(f"the prompt is {n} tokens; with --max-new-tokens {max_new_tokens} that is "
                           f"{n + max_new_tokens} positions, more than the model's {max_positions}: {fix}")


def _load_target(name_or_path: str, device_name: str | None, dtype_name: str, trust_remote_code: bool):
    """Target and tokenizer; a named target ("smollm2") is converted on first use."""
    from .target import load_target

    return load_target(name_or_path, device=_pick_device(device_name), dtype=dtype_name, trust_remote_code=trust_remote_code)


def _encode_prompt(tokenizer, prompt: str, use_chat_template: bool):
    if use_chat_template and tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
    else:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    return ids


def _proposer(args, target, tokenizer):
    import draftheads as dh

    chosen = [bool(args.heads), bool(getattr(args, "draft_model", None)), bool(getattr(args, "prompt_lookup", False))]
    if sum(chosen) != 1 and chosen != [True, False, True]:
        raise SystemExit("error: give one of --heads DIR, --draft-model PATH_OR_ID, --prompt-lookup "
                         "(or --heads DIR --prompt-lookup: lookup first, the heads where it finds no match)")
    if args.heads:
        return _load_heads(args.heads, target, not args.no_fingerprint_check)
    if args.prompt_lookup:
        return dh.PromptLookupProposer()
    draft, draft_tok = _load_target(args.draft_model, args.device, args.dtype, args.trust_remote_code)
    return dh.DraftModelProposer(draft, gamma="auto", target_tokenizer=tokenizer, draft_tokenizer=draft_tok)


def cmd_generate(args) -> int:
    import torch
    from transformers import TextStreamer

    import draftheads as dh

    target, tokenizer = _load_target(args.target, args.device, args.dtype, args.trust_remote_code)
    options = {"draw_drafts": False} if args.top_k_drafts and args.heads else {}
    if args.heads and args.prompt_lookup is not None:  # else the heads' plan decides
        options["prompt_lookup"] = args.prompt_lookup
    decoder = dh.SpeculativeDecoder(target, _proposer(args, target, tokenizer), **options)
    ids = _encode_prompt(tokenizer, args.prompt, not args.no_chat_template)
    _check_prompt(ids, args.max_new_tokens, decoder.max_positions)
    streamer = None if args.quiet else TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    generator = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    out = decoder.generate(
        ids,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        streamer=streamer,
        generator=generator,
    )
    seconds = time.perf_counter() - start
    if args.quiet:
        print(tokenizer.decode(out.sequences[0, ids.shape[1] :], skip_special_tokens=True))
    new = out.num_new_tokens
    print(
        f"\n[{new} tokens in {seconds:.2f}s: {new / seconds:.1f} tokens/s, "
        f"{out.mean_accept_length:.2f} tokens per target forward over {len(out.accept_lengths)} steps]",
        file=sys.stderr,
    )
    line = plan_line(out.stats)
    if line:
        print(line, file=sys.stderr)
    budget = out.stats.get("draft_budget")
    if budget:  # what the draft budget chose: full drafts, shorter ones, plain steps
        steps = budget["steps"]
        lengths = out.stats.get("gamma_histogram")  # a draft model: steps by drafted chain length
        sources = "".join(f"; {name}: {its['steps']['full']} full, {its['steps']['capped']} shortened, "
                          f"{its['steps']['plain']} plain" for name, its in budget.get("sources", {}).items())
        print(f"[draft budget: {steps['full']} full, {steps['capped']} shortened, {steps['plain']} plain steps"
              + sources + (f"; steps by draft length {lengths}" if lengths else "") + "]", file=sys.stderr)
    drafted = out.stats.get("drafted_by")
    if drafted:  # heads behind prompt lookup: who drafted the steps that drafted
        why = out.stats.get("plan", {}).get("prompt_lookup", "")
        print(f"[prompt lookup in front of the heads ({why}): {drafted['lookup']} steps drafted by lookup, "
              f"{drafted['heads']} by the heads]", file=sys.stderr)
    return 0


_ASKED = {"prompt_lookup argument": "asked: --prompt-lookup", "tree argument": "asked: a tree",
          "batch_plan argument": "asked: a batch plan"}


def plan_line(stats: dict) -> str | None:
    """One line on what a heads decode ran and what decided it: tree.json's entry, or what the
    command line asked for over it (``out.stats["plan"]``; None for drafters without a plan)."""
    plan = stats.get("plan") or {}
    if "from" not in plan:
        return None
    entry = plan.get("entry")
    where = (f"{entry['chosen_by']}'s entry for {entry['device_type'] or 'any device'}, batch {entry['batch_size']}, "
             f"temperature {entry['temperature']:g}" if entry else "no plan entry")
    source = plan["from"]["mode"]
    if stats.get("mode") == "plain":
        why = "tree.json" if source == "tree.json" else _ASKED.get(source, source)
        return f"[plan: plain decoding ({why}, {where})]"
    if plan.get("lookup"):
        lookup_from = plan["from"]["prompt_lookup"]
        what = f"prompt lookup in front ({'tree.json' if lookup_from == 'tree.json' else _ASKED.get(lookup_from, lookup_from)})"
    else:
        what = "the heads alone"
    over = (f", over the plan's plain entry ({where})" if entry and entry["mode"] == "plain" and source in _ASKED
            else f" ({where})")
    return f"[plan: speculative, {what}{over}]"


def _check_writable(folder: Path) -> None:
    """Fail before a long calibration, not after it, when its result could not be saved."""
    import os
    import tempfile

    if not folder.is_dir():
        return  # load_heads names a missing folder
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SystemExit(
            f"error: cannot write tree.json into {folder} ({e.strerror or e}): make the heads folder writable, "
            "or use --dry-run to calibrate without saving"
        ) from None


def _calibration_prompts(args, tokenizer) -> list:
    """Prompts from a named set shipped in the package (default: ``user``, prompts shaped like
    users' requests, never the evaluation questions) or a text/jsonl file (one prompt per line or
    `turns`/`prompt`/`text` fields), checked (`data.plan_prompts`: an empty, binary or
    evaluation-overlapping file is refused by name)."""
    from .data.plan_prompts import AUTO, PromptFileError, default_set, encode_prompts, read_prompt_texts

    name = args.prompts
    if name == AUTO:  # the user-like set for a chat model, raw-text beginnings for a base model
        name = default_set(bool(getattr(tokenizer, "chat_template", None)) and not args.no_chat_template)
    try:
        texts = read_prompt_texts(name, "--prompts")
    except PromptFileError as e:
        raise SystemExit(f"error: {e}") from None
    return encode_prompts(tokenizer, texts[: args.num_prompts], not args.no_chat_template, args.prompt_tokens)


def _calibrate_dynamic(args, target, heads, prompts, temperature: float, greedy_choice: dict | None,
                       curve) -> tuple[list, dict]:
    """EAGLE heads: time each (token budget, depth, top-k) setting of the device's grid, sized by
    this machine's cost ``curve``, at ``temperature`` (after a greedy choice, the short sampling
    grid beside it); the fastest as tree.json entries, and the chosen setting."""
    from .tune.calibrate import calibrate_dynamic_tree, dynamic_grid, restricts_vocab, sampling_grid
    from .tune.tables import dynamic_entries

    grid = dynamic_grid(target.device.type, restricts_vocab(heads), curve.verify_seconds)
    if temperature > 0 and greedy_choice is not None:
        grid = sampling_grid(grid, greedy_choice)
    result = calibrate_dynamic_tree(target, heads, prompts, new_tokens=args.new_tokens, grid=grid, temperature=temperature)
    print("setting (total tokens, depth, top-k): tokens/s, tokens per step")
    for c in sorted(result.candidates, key=lambda c: -c["tokens_per_second"])[:8]:
        print(f"  {c['total_tokens']:3d} {c['depth']:2d} {c['top_k']:2d}: {c['tokens_per_second']:7.1f}  {c['mean_accept_length']:.2f}")
    print(f"chosen: {result.tree}, {result.mean_accept_length:.2f} tokens/step, "
          f"{result.expected_speedup:.2f}x our plain one-token steps")
    plan = _batch_plan(args, target, heads, result.tree, prompts, temperature)
    return dynamic_entries(result, target.device.type, plan, device_name=curve.device_name), result.tree


def _calibrate_static(args, target, heads, prompts, temperature: float, verify: dict | None) -> tuple[list, dict]:
    """Medusa/Hydra/DFlash heads: the tree with the best expected tokens per second at
    ``temperature``, as tree.json entries (and the verify times, reused at the next temperature)."""
    from .tune.calibrate import calibrate
    from .tune.tables import static_entries

    result = calibrate(target, heads, prompts, new_tokens=args.new_tokens, max_nodes=args.max_nodes,
                       temperature=temperature, verify=verify)
    print("head accuracy by rank (rows: heads)" + (f", as the chance of acceptance at temperature {temperature:g}:"
                                                   if temperature > 0 else ":"))
    for k, row in enumerate(result.accuracy):
        print(f"  head {k}: " + " ".join(f"{a:.2f}" for a in row))
    print("drafting, median ms by heads used: " + ", ".join(
        f"{d}: {s * 1000:.2f}" for d, s in sorted(result.draft_seconds.items()) if d))
    print(f"chosen tree: {len(result.tree) + 1} nodes, expected {result.expected_tokens_per_step:.2f} tokens/step, "
          f"expected speedup {result.expected_speedup:.2f}x over 1-token steps")
    print(f"tree: {result.tree}")
    vocab = result.draft_vocab_size
    print(f"draft vocabulary: {'the whole vocabulary' if vocab is None else f'the {vocab} most frequent training tokens'}")
    plan = _batch_plan(args, target, heads, result.tree, prompts, temperature, vocab)  # as its entry will run it
    from .device import device_name

    return static_entries(result, target.device.type, plan, device_name=device_name(target.device)), result.verify_seconds


def _batch_plan(args, target, heads, tree, prompts, temperature: float = 0.0, draft_vocab_size: int | None = None):
    """With --batch-sizes: time the chosen tree (with its draft vocabulary) against plain decoding
    per batch size at ``temperature`` (a `tune.batch_plan.BatchPlanResult`); else None."""
    from .tune.tables import drafts_nothing

    if not args.batch_sizes or (drafts_nothing(tree) and not args.prompt_lookup):  # plain: nothing to time
        return None
    from .tune.batch_plan import measure_batch_plan

    result = measure_batch_plan(target, heads, tree, prompts, args.batch_sizes, new_tokens=args.new_tokens,
                                temperature=temperature, try_lookup=args.prompt_lookup,
                                draft_vocab_size=draft_vocab_size, rounds=args.rounds, resolution=args.resolution,
                                max_seconds=args.max_seconds)
    print("\n".join(result.lines()))
    return result


def _plan_batch_sizes(text: str) -> list[int]:
    """calibrate's --batch-sizes: sizes like 1,4,8, or none (no timing against plain decoding)."""
    return [] if text.strip().lower() == "none" else batch_sizes(text)


def _temperatures(text: str) -> list[float]:
    from .plans import parse_temperatures

    try:
        return parse_temperatures(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def cmd_calibrate(args) -> int:
    """Measure the best tree per temperature (and batch size) on this device and save them in the
    heads' tree.json, replacing what was measured on this device type before and keeping the
    entries of other device types."""
    from .heads.confidence import write_confidence
    from .plans import TreePlans, write_plans
    from .registry import TreeKind, method_of

    from .heads.hub import is_hub_reference
    if is_hub_reference(args.heads) and not args.dry_run:  # tree.json would land in the Hub cache
        raise SystemExit(f"error: --heads {args.heads} names Hub heads; calibrate saves tree.json into the heads folder: "
                         f"download them (huggingface-cli download {args.heads} --local-dir DIR) and calibrate DIR, or pass --dry-run")
    if not args.dry_run:
        _check_writable(Path(args.heads))
    target, tokenizer = _load_target(args.target, args.device, args.dtype, args.trust_remote_code)
    heads = _load_heads(args.heads, target, not args.no_fingerprint_check)
    prompts = _calibration_prompts(args, tokenizer)
    saved = heads.plans  # the file as loaded (read once), before calibration changes the heads
    from .tune.calibrate import describe_curve, measure_cost_curve

    context = min(256, max(int(p.shape[-1]) for p in prompts) + args.new_tokens)
    sizes = [n for n in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if n <= args.max_nodes + 1]
    curve = measure_cost_curve(target, sizes, context=context)  # this machine's own: the widths are chosen with it
    print(describe_curve(curve))
    entries, verify, greedy_choice = [], curve.verify_seconds, None
    if method_of(heads).confidence is not None:  # EAGLE trees rank nodes by it, so it is measured first
        from .tune.calibrate import calibrate_confidence

        heads.confidence = calibrate_confidence(target, heads, prompts, new_tokens=args.new_tokens)
        print("chance of acceptance by draft probability (rows: rank among siblings), which the trees rank nodes by:")
        print("\n".join("  " + line for line in heads.confidence.summary()))
    for temperature in args.temperatures:
        if len(args.temperatures) > 1:
            print(f"-- temperature {temperature:g}{' (greedy)' if temperature == 0 else ''}")
        if method_of(heads).tree is TreeKind.DYNAMIC:
            found, chosen = _calibrate_dynamic(args, target, heads, prompts, temperature, greedy_choice, curve)
            entries += found
            greedy_choice = chosen if temperature == 0 else greedy_choice
        elif temperature > 0 and method_of(heads).tree is TreeKind.ONE_FORWARD:
            # Their table holds greedy hit rates; at T > 0 acceptance is the target's tempered
            # probability of each draft, which is not measured for them yet: no entry rather than
            # one chosen from the wrong figure (requests there use the nearest measured plan).
            print(f"{heads.head_type} heads: no tree measured at temperature {temperature:g} (greedy only for now)")
        else:
            found, verify = _calibrate_static(args, target, heads, prompts, temperature, verify)
            entries += found
    measured = TreePlans(tuple(entries), curves=(curve,))
    if not args.dry_run:
        plans = saved.merged(measured) if saved is not None else measured
        path = write_plans(args.heads, plans)
        if heads.confidence is not None:
            print(f"saved to {write_confidence(args.heads, heads.confidence)}: EAGLE trees rank their nodes by it")
        kept = len(plans.entries) - len(measured.entries)
        print(f"saved to {path}: SpeculativeDecoder uses it by default on {target.device.type} "
              f"({len(measured.entries)} plan entries" + (f"; kept {kept} measured on other device types)" if kept else ")"))
    return 0


def cmd_bench(args) -> int:
    from .bench.command import run_bench

    return run_bench(args, lambda path: _load_target(path, args.device, args.dtype, args.trust_remote_code))


def cmd_train(args) -> int:
    from .train.command import run_command

    return run_command(args)


def _add_target_args(p: argparse.ArgumentParser, *, required: bool = False, decodes: bool = True) -> None:
    """The target options. ``required``: no "smollm2" default (a command whose output is tied to
    one target must name it); ``decodes``: the command prompts the target with
    heads (prompt and heads-check options)."""
    if required:
        p.add_argument("--target", required=True,
                       help='HF model id or folder the heads are for; "smollm2" = the real small model installed from PyPI')
    else:
        p.add_argument("--target", default="smollm2",
                       help='HF model id or folder (default: "smollm2", the real small model installed from PyPI)')
    p.add_argument("--device", default=None, help="cuda, cuda:1, cpu (default: cuda if available)")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA with bf16, else fp16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom modeling code from the hub")
    if decodes:
        p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
        p.add_argument("--no-fingerprint-check", action="store_true",
                       help="load heads whose config.json records no target LM-head fingerprint (you vouch that they "
                            "were trained for --target)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftheads")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from .train.command import add_arguments as add_train_arguments

    add_train_arguments(sub.add_parser("train", help="train draft heads (same as train.py)")).set_defaults(func=cmd_train)

    p = sub.add_parser("generate", help="decode a prompt speculatively, streaming the text")
    _add_target_args(p)
    p.add_argument("--heads", help="heads folder")
    p.add_argument("--draft-model", help="a small LM with the same tokenizer (classic speculative sampling)")
    p.add_argument("--prompt-lookup", action=argparse.BooleanOptionalAction, default=None,
                   help="draft by n-gram lookup in the prompt. With --heads: lookup where the text repeats, the heads "
                        "elsewhere, for every request; --no-prompt-lookup: the heads alone (default: as the heads' "
                        "tree.json says, where it measured faster)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=positive_int, default=256)
    p.add_argument("--temperature", type=float, help="0 = greedy; default: the model's generation config, as generate()")
    p.add_argument("--top-k", type=int, help="0 = off; default: the model's generation config (else 50), as generate()")
    p.add_argument("--top-p", type=float, help="default: the model's generation config (else 1.0), as generate()")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--top-k-drafts", action="store_true",
                   help="with --heads at temperature > 0: draft the heads' top-k tree instead of drawing a chain from "
                        "their own distribution (the default)")
    p.add_argument("--quiet", action="store_true", help="print the text at the end instead of streaming it")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("calibrate", help="measure acceptance and verify cost, save the best tree")
    _add_target_args(p)
    p.add_argument("--heads", required=True)
    p.add_argument("--prompts", default="auto", metavar="NAME_OR_FILE",
                   help=f"a set shipped in the package ({describe_names()}; not the evaluation sets), a text file "
                        f"(one prompt per line) or a Spec-Bench .jsonl (default auto: {DEFAULT_CALIBRATION_PROMPTS}, 32 "
                        "prompts shaped like users' requests, or text, raw-text beginnings, for a model without a chat "
                        "template); refused when empty, binary or holding evaluation questions")
    p.add_argument("--num-prompts", type=positive_int, default=12)
    p.add_argument("--prompt-tokens", type=positive_int, default=128, help="keep the last N tokens of each prompt")
    p.add_argument("--new-tokens", type=positive_int, default=64)
    p.add_argument("--max-nodes", type=positive_int, default=64)
    p.add_argument("--dry-run", action="store_true", help="print the chosen tree without saving it")
    p.add_argument("--batch-sizes", type=_plan_batch_sizes, default=[1], metavar="1,4,8",
                   help="also time the chosen tree against plain decoding at these batch sizes, alone and behind prompt "
                        "lookup, and save a per-size plan (tree.json entries per batch size): SpeculativeDecoder decodes "
                        "plainly where speculation loses and keeps lookup in front where it pays (default: 1; none: save "
                        "the tree alone, untimed against plain decoding and lookup)")
    p.add_argument("--prompt-lookup", action=argparse.BooleanOptionalAction, default=True,
                   help="with --batch-sizes: also time the tree behind prompt lookup and save it where it is faster "
                        "(tree.json prompt_lookup; default: on)")
    p.add_argument("--rounds", type=positive_int, default=2,
                   help="with --batch-sizes: rounds over the prompts at most (default: 2)")
    p.add_argument("--resolution", type=float, default=0.01,
                   help="with --batch-sizes: stop timing a batch size once its verdict is settled to this (the 95%% "
                        "interval excludes the threshold or is narrower than this either side; default: 0.01)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="with --batch-sizes: time bound per batch size and temperature (default: none)")
    p.add_argument("--temperatures", type=_temperatures, default=[0.0], metavar="0,0.7,1.0",
                   help="measure a tree (and the batch plan) at each of these sampling temperatures (0 = greedy); "
                        "the decoder runs the one nearest a request's temperature (default: 0)")
    p.set_defaults(func=cmd_calibrate)

    from .bench.command import add_parser as add_bench_parser

    add_bench_parser(sub, _add_target_args).set_defaults(func=cmd_bench)

    from .bench.demo import add_parser as add_demo_parser, run_demo

    add_demo_parser(sub, _add_target_args).set_defaults(
        func=lambda args: run_demo(args, lambda path: _load_target(path, args.device, args.dtype, args.trust_remote_code)))

    from .data.distill_command import add_parser as add_distill_parser

    add_distill_parser(sub)

    from .train.features_command import add_parser as add_cache_features_parser

    add_cache_features_parser(sub)

    from .export.command import add_import_parser, add_parser as add_export_parser, run_import

    add_export_parser(sub)
    from .export.push import add_parser as add_push_parser
    add_push_parser(sub)
    add_import_parser(sub, lambda p: _add_target_args(p, required=True, decodes=False)).set_defaults(
        func=lambda args: run_import(args, lambda path: _load_target(path, args.device, args.dtype, args.trust_remote_code))
    )
    # from the registered commands, so the summary never lists fewer than exist
    parser.description = "draftheads: train speculative-decoding draft heads, decode losslessly. Commands: " + ", ".join(sub.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # a bad --target, heads folder, prompt or sampling value: the message, not a traceback
        from .target import TargetLoadError

        if not isinstance(e, (TargetLoadError, CommandError, *_user_errors())):
            raise
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return 2


def one_line(message: str) -> str:
    """A message as one line: its list items (``\n  - x``) joined with "; "."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return message
    first, rest = lines[0], [line.removeprefix("- ") for line in lines[1:]]
    return first + (" " if first.endswith(":") else "; ") + "; ".join(rest) if rest else first


def _user_errors() -> tuple[type, ...]:
    """Errors of bad input that commands let through to ``main`` (each names what to fix)."""
    from .heads.io import UnverifiedTargetError
    from .inference.sampling import SamplingError

    return (SamplingError, UnverifiedTargetError)


if __name__ == "__main__":
    raise SystemExit(main())
