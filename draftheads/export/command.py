"""`draftheads export HEADS OUT --format F` and `draftheads import SRC OUT --target T`."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from .formats import EXPORT_FORMATS


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "export",
        help="write heads in an engine's format (vLLM, SGLang, speculators, transformers)",
        description="Medusa -> vLLM MedusaModel; EAGLE -> vLLM EAGLE-1 or SGLang EAGLE; EAGLE-3 -> speculators "
                    "(what --format vllm writes) or SGLang LlamaForCausalLMEagle3; DFlash -> vLLM (z-lab layout) or "
                    "transformers' own DFlash drafter (generate(..., speculation_type='dflash')). Heads a format cannot hold "
                    "exactly are refused, never approximated.",
    )
    p.add_argument("heads", metavar="HEADS", help="draftheads heads folder (config.json + model.safetensors)")
    p.add_argument("out", metavar="OUT", help="output folder (written atomically)")
    p.add_argument("--format", required=True, choices=list(EXPORT_FORMATS))
    p.add_argument("--verifier", metavar="PATH_OR_ID",
                   help="the target as the engine opens it (default: the target the heads were trained for; "
                        '"smollm2" = its cache folder)')
    p.add_argument("--num-speculative-tokens", type=int, default=None, metavar="N",
                   help="EAGLE-3 heads in the speculators layout (--format vllm or speculators): draft tokens per "
                        "step written to the config (default: the heads' training draft steps); refused for exports "
                        "that do not record it (the engine takes it at serve time)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists (an earlier export or import)")
    p.add_argument("--no-engine-check", action="store_true",
                   help="write a layout the installed engine cannot serve (DSpark and DFlash2 need vLLM's Model Runner "
                        "V2, on a GPU), for a machine whose engine can")
    p.set_defaults(func=cmd_export)
    return p


def cmd_export(args) -> int:
    from . import ExportError, export_heads

    try:
        out = export_heads(args.heads, args.out, args.format, verifier=args.verifier,
                           num_speculative_tokens=args.num_speculative_tokens, overwrite=args.overwrite,
                           engine_check=not args.no_engine_check)
    except (ExportError, FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.heads} as {args.format} to {out}")
    return 0


def add_import_parser(sub, add_target_args: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "import",
        help="convert a Medusa / EAGLE / EAGLE-3 / speculators checkpoint into a draftheads heads folder",
        # The layouts are the methods' (registry.ImportLayout): listing them would load torch, which
        # --help must not. An unknown --format, or a checkpoint in no layout, is refused with the list.
        description="Reads the public checkpoint layouts the drafting methods declare, detected from the "
                    "checkpoint's config and tensors or forced with --format; an unknown --format is refused "
                    "with the list of layouts and what each holds.",
    )
    p.add_argument("src", metavar="SRC", help="checkpoint folder or weights file")
    p.add_argument("out", metavar="OUT", help="heads folder to write")
    add_target_args(p)
    p.add_argument("--format", default=None, metavar="LAYOUT",
                   help="skip detection: the checkpoint's layout (an unknown name is refused with the list of layouts)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it exists (an earlier import or export)")
    p.add_argument("--allow-other-verifier", action="store_true",
                   help="import even though SRC's config names another verifier than --target (you vouch that "
                        "--target is that model, e.g. a local copy)")
    return p


def run_import(args, load_model: Callable[[str], tuple]) -> int:
    from pathlib import Path

    from .common import check_output_folder
    from .importers import check_import_format, import_heads

    try:  # before loading the target: a typo costs a second
        check_output_folder(Path(args.out), args.src, args.overwrite)
        check_import_format(args.format)
    except (FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    target, _ = load_model(args.target)
    try:
        out = import_heads(args.src, args.out, target, format=args.format, overwrite=args.overwrite,
                           target_name=args.target, allow_other_verifier=args.allow_other_verifier)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"imported {args.src} to {out}")
    return 0
