"""What the two vLLM benchmarks share: bench_vllm_serving.py (vLLM's offline engine, with the
acceptance check against draftheads' own decoding) and bench_vllm_serve.py (the ``vllm serve``
server users run). One place for their command-line arguments, the prompts, each head type's
``speculative_config`` and the loader of the stdlib-only helpers in tests/engines/, so the two
measure the same prompts with the same drafter settings.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

from prompts import DEFAULT_TARGET, add_questions_argument, load_prompts

REPO = Path(__file__).resolve().parents[1]

# head_type -> the `method` of vLLM's speculative_config for its `draftheads export --format vllm`
# folder. vLLM 0.32 guesses a missing method from the folder's name, so it is always named. A head
# type with a vLLM export needs only its entry here to be served by both benchmarks.
SPECULATIVE_METHODS: dict[str, str] = {"medusa": "medusa", "eagle": "eagle", "eagle3": "eagle3"}


def engines_module(name: str):
    """A stdlib-only helper from tests/engines/ (shared with the vLLM tests), loaded by path."""
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "engines" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def add_arguments(p: argparse.ArgumentParser, *, max_tokens: int, rounds: int) -> None:
    """The arguments both benchmarks take (defaults that differ are passed in)."""
    p.add_argument("--heads", nargs="*", default=[], metavar="NAME=DIR",
                   help="draftheads heads folders to export and serve, e.g. eagle3=runs/smollm2/heads")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"a model folder or a target name (default: {DEFAULT_TARGET})")
    add_questions_argument(p)
    p.add_argument("--out", required=True, help="folder for results.json, results.md, the exports and the engine logs")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated numbers of requests in flight")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompts-at-c1", type=int, default=None,
                   help="concurrency 1 (the slowest level) decodes only the first N prompts (default: all)")
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--k", type=int, default=3, help="num_speculative_tokens for every drafter")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--vllm-python", default=os.environ.get("DRAFTHEADS_VLLM_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python")))


def finish_arguments(p: argparse.ArgumentParser, args: argparse.Namespace, reserved: tuple[str, ...]) -> argparse.Namespace:
    """Checks what argparse cannot: ``--heads`` becomes {name: (folder, head_type)}, each a heads
    folder whose type vLLM serves; ``reserved`` names (the engines that are not heads) are refused."""
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    heads: dict[str, tuple[str, str]] = {}
    for item in args.heads:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            p.error(f"--heads takes NAME=DIR, got {item!r}")
        if name in reserved or name in heads:
            p.error(f"--heads name {name!r} is taken")
        config = Path(folder) / "config.json"
        if not config.is_file():
            p.error(f"--heads {name}: {folder} is not a heads folder (no config.json)")
        head_type = json.loads(config.read_text()).get("head_type")
        if head_type not in SPECULATIVE_METHODS:
            p.error(f"--heads {name}: {head_type!r} heads have no vLLM speculative_config here "
                    f"(known: {', '.join(SPECULATIVE_METHODS)}; add it to SPECULATIVE_METHODS in {Path(__file__).name})")
        heads[name] = (folder, head_type)
    args.heads = heads
    if not Path(args.vllm_python).is_file():
        p.error(f"no vLLM python at {args.vllm_python}: run scripts/setup_vllm_env.sh or pass --vllm-python")
    return args


def speculative_config(head_type: str, export_dir: Path, k: int) -> dict:
    return {"method": SPECULATIVE_METHODS[head_type], "model": str(export_dir), "num_speculative_tokens": k}


def level_prompts(args: argparse.Namespace, c: int) -> int:
    """How many prompts concurrency ``c`` decodes (the first ones)."""
    return args.prompts_at_c1 if c == 1 and args.prompts_at_c1 else args.num_prompts


def target_prompts(args: argparse.Namespace, target_dir: str) -> list[list[int]]:
    """The prompts as token ids (benchmarks/prompts.py: chat-templated first turns of --questions);
    ``args.prompt_tokens`` becomes the longest one's length, which the engines' ``max_model_len``
    is sized by."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = [p[0].tolist() for p in load_prompts(tokenizer, args.questions, args.num_prompts)]
    args.prompt_tokens = max(len(p) for p in prompts)
    return prompts


def cpu_name() -> str:
    from draftheads.bench.environment import cpu_name as name

    return name()
