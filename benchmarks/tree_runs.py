"""What the tree benchmarks on a real target share (`confidence_trees.py`, `drawn_trees.py`): their
common arguments and --settings choice, the target and heads loaded as they decode there (fp32 on
the CPU, no EOS, so every decode runs its full length), the held-out questions through the chat
template, and the header of their report."""
from __future__ import annotations

import argparse
import platform
import time

import torch

import draftheads as dh
from draftheads.bench.questions import load_questions
from draftheads.data.plan_prompts import encode_prompts
from draftheads.device import device_name
from draftheads.target import load_target


def add_arguments(ap: argparse.ArgumentParser, settings: dict, num_questions: int) -> None:
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--heads", required=True)
    ap.add_argument("--questions", default="mt-bench")
    ap.add_argument("--num-questions", type=int, default=num_questions)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--settings", default=",".join(settings), help=f"which of {', '.join(settings)}")
    ap.add_argument("--out", required=True)


def chosen_settings(ap: argparse.ArgumentParser, args: argparse.Namespace, settings: dict) -> dict:
    """The --settings named, in their order; the parser's error naming any unknown one."""
    names = args.settings.split(",")
    unknown = [name for name in names if name not in settings]
    if unknown:
        ap.error(f"--settings: unknown {', '.join(unknown)} (known: {', '.join(settings)})")
    return {name: settings[name] for name in names}


def load(args: argparse.Namespace):
    """(target, tokenizer, heads, chat, questions, their first turns encoded)."""
    torch.set_num_threads(args.threads)
    target, tokenizer = load_target(args.target, device="cpu", dtype="float32")
    target.eval()
    target.generation_config.eos_token_id = None
    heads = dh.load_heads(args.heads, target=target).eval()
    chat = bool(getattr(tokenizer, "chat_template", None))
    questions = load_questions(args.questions)[: args.num_questions]
    prompts = encode_prompts(tokenizer, [q.turns[0] for q in questions], chat, 256)
    return target, tokenizer, heads, chat, questions, prompts


def header(args: argparse.Namespace, heads, questions: list) -> dict:
    """The report's first fields: what ran, where and when, on which questions."""
    return {"target": args.target, "heads": args.heads, "head_type": heads.head_type, "threads": args.threads,
            "machine": f"{device_name(torch.device('cpu'))} ({platform.machine()})", "date": time.strftime("%Y-%m-%d"),
            "questions": len(questions), "question_set": args.questions, "new_tokens": args.new_tokens}
