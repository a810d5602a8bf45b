"""`draftheads push HEADS_OR_EXPORT_DIR REPO_ID`: share heads on the Hugging Face Hub.

Uploads a draftheads heads folder (config.json with head_type + model.safetensors) or an engine
folder written by `draftheads export` with ``huggingface_hub.upload_folder``, model card included:
a folder without README.md gets one (export/card.py); a card draftheads wrote names the folder by
its local path in its snippets, which the uploaded copy replaces by the repo id (what users of the
Hub copy pass to `load_heads`, `draftheads export` or vLLM). Anything else (a training run folder, a
model folder, an arbitrary folder) is refused by name before anything is sent.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ..plans import TREE_NAME


def folder_files() -> tuple[str, ...]:
    """What a heads/export folder holds; nothing else (checkpoints, logs, stray files) is uploaded."""
    from ..heads.confidence import CONFIDENCE_NAME  # here, not at import: `draftheads export --help` loads no torch

    return ("config.json", "model.safetensors", TREE_NAME, CONFIDENCE_NAME, "draftheads_export.json", "README.md")


class PushError(ValueError):
    """A folder that is not a heads or export folder, or a repo id that cannot be one."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "push",
        help="upload a heads or export folder to the Hugging Face Hub, with its model card",
        description="Upload a draftheads heads folder or a `draftheads export` folder with "
                    "huggingface_hub.upload_folder. A folder without README.md gets a model card first.",
    )
    p.add_argument("folder", metavar="HEADS_OR_EXPORT_DIR", help="a heads folder (e.g. runs/smollm2/heads) or an export folder")
    p.add_argument("repo_id", metavar="REPO_ID", help="the Hub repo to create or update, org/name")
    p.add_argument("--private", action="store_true", help="create the repo private (an existing repo keeps its visibility)")
    p.add_argument("--revision", default=None, help="branch to push to (default: main)")
    p.add_argument("--message", default=None, help="commit message (default: 'Upload draftheads heads from FOLDER_NAME')")
    p.set_defaults(func=cmd_push)
    return p


def upload_files(folder: Path) -> list[str]:
    """The files of ``folder`` that go to the Hub, refusing a folder that is not heads or an export."""
    from .card import folder_kind

    if not folder.is_dir():
        raise PushError(f"{folder} is not a folder: pass a heads folder or a `draftheads export` folder")
    kind = folder_kind(folder)
    if kind is None:
        what = ""
        if (folder / "heads" / "config.json").is_file():
            what = f": it is a training run folder; push its heads, {folder / 'heads'}"
        elif (folder / "config.json").is_file():
            what = ": its config.json is neither a heads config (no head_type/format_version) nor an export's"
        else:
            what = ": it has no config.json"
        raise PushError(f"{folder} is neither a draftheads heads folder nor a `draftheads export` folder{what}")
    if not (folder / "model.safetensors").is_file():
        raise PushError(f"{folder} has no model.safetensors: nothing to push")
    return [name for name in folder_files() if (folder / name).is_file()]


def hub_card(folder: Path, repo_id: str) -> str:
    """The README.md the Hub copy gets: the folder's own card, with its local path replaced by the
    repo id where draftheads wrote the card; a fresh card naming the repo when there is none."""
    from .card import CARD_NAME, MARKER, card_for_folder

    card = folder / CARD_NAME
    if not card.is_file():
        return card_for_folder(folder, where=repo_id)
    text = card.read_text(encoding="utf-8")
    if MARKER not in text:
        return text  # the user's own card: uploaded as written
    names = {str(folder), str(folder.absolute()), str(folder.resolve()), os.path.relpath(folder)}
    for local in sorted(names, key=len, reverse=True):  # the longest first: a relative path is inside the absolute one
        text = text.replace(local, repo_id)
    return text


def push(folder: str | os.PathLike, repo_id: str, *, private: bool = False, revision: str | None = None,
         message: str | None = None) -> str:
    """Upload ``folder`` to ``repo_id`` (created if missing); returns the commit URL. Writes the
    local card if the folder has none (the Hub copy names the repo instead of the path)."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    from .card import CARD_NAME, card_for_folder, write_card

    folder = Path(folder)
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise PushError(f"{repo_id!r} is not a Hub repo id (org/name): {e}") from None
    if "/" not in repo_id:
        raise PushError(f"{repo_id!r}: give the repo as org/name (your user or organisation, then the repo)")
    names = upload_files(folder)
    if CARD_NAME not in names:
        write_card(folder, card_for_folder(folder))
        names.append(CARD_NAME)
    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    if revision:
        api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="draftheads-push-") as staging:
        # The upload set, staged: links to the folder's files (no copy of the weights) and the Hub card.
        stage = Path(staging)
        for name in names:
            if name != CARD_NAME:
                _link(folder / name, stage / name)
        (stage / CARD_NAME).write_text(hub_card(folder, repo_id), encoding="utf-8")
        info = api.upload_folder(
            repo_id=repo_id, folder_path=str(stage), repo_type="model", revision=revision,
            commit_message=message or f"Upload draftheads heads from {folder.name}",
        )
    return str(getattr(info, "commit_url", info))


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        os.symlink(src.absolute(), dst)


def cmd_push(args) -> int:
    try:
        url = push(args.folder, args.repo_id, private=args.private, revision=args.revision, message=args.message)
    except (PushError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # huggingface_hub: not logged in, no permission, network
        print(f"error: pushing {args.folder} to {args.repo_id} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"pushed {args.folder} to https://huggingface.co/{args.repo_id} ({url})")
    return 0
