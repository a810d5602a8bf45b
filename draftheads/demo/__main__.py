"""``python -m draftheads.demo``: build the demo target for the given settings and print its summary."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

from . import __doc__ as PACKAGE_DOC
from .build import build_demo_target, default_target_dir, is_complete, summary
from .spec import DemoTargetSpec

_SPEC_FLAGS = {
    "max_tokens": "training tokens",
    "num_layers": "decoder layers",
    "hidden_size": "hidden width",
    "num_heads": "attention heads",
    "intermediate_size": "MLP width (default: 8/3 of the hidden width, rounded up to a multiple of 64)",
    "num_threads": "torch threads while building",
}


def spec_from_args(args: argparse.Namespace) -> DemoTargetSpec:
    """The default spec with the fields given on the command line replaced (a new cache folder)."""
    changes = {name: getattr(args, name) for name in _SPEC_FLAGS if getattr(args, name, None) is not None}
    return dataclasses.replace(DemoTargetSpec(), **changes)


def main(argv: list[str] | None = None) -> None:
    """``python -m draftheads.demo``: build the demo target and print its summary."""
    parser = argparse.ArgumentParser(prog="python -m draftheads.demo", description=PACKAGE_DOC.splitlines()[0])
    parser.add_argument("--out", help="output folder (default: the cache folder for these settings)")
    parser.add_argument("--force", action="store_true", help="rebuild even if a finished build exists")
    for name, help_text in _SPEC_FLAGS.items():
        default = getattr(DemoTargetSpec, name)
        suffix = "" if default is None else f" (default: {default:,})"
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=help_text + suffix)
    args = parser.parse_args(argv)
    spec = spec_from_args(args)
    target = pathlib.Path(args.out).expanduser() if args.out else default_target_dir(spec)
    folder = target if is_complete(target, spec) and not args.force else build_demo_target(target, spec)
    print(summary(folder))


if __name__ == "__main__":
    main()
