"""Reading and writing ``tree.json``: the only code that opens the file.

A load parses it once (`read_plans`, or `plans_at` for a file or folder a user names) into a
checked `TreePlans`; every writer (calibration, training's tree choice, saving heads with a tree)
goes through `write_plans`, which writes the current format atomically (a reader sees the old
file or the new one, never a part).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..atomic import write_json_atomically
from .schema import TreePlans, from_json

TREE_NAME = "tree.json"


def tree_file(folder: str | os.PathLike) -> Path:
    return Path(folder) / TREE_NAME


def read_plans(folder: str | os.PathLike) -> TreePlans | None:
    """The plans saved in ``folder`` (None: no tree file), checked; a ValueError naming the file
    and what to do otherwise."""
    path = tree_file(folder)
    if not path.is_file():
        return None
    return _read(path)


def plans_at(path: str | os.PathLike) -> TreePlans:
    """The plans in ``path``: a heads folder (its tree.json) or a tree file itself; an error
    naming the path when there are none."""
    path = Path(path)
    if path.is_dir():
        plans = read_plans(path)
        if plans is None:
            raise FileNotFoundError(f"{path} holds no {TREE_NAME} (train or calibrate the heads to write one)")
        return plans
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: pass a heads folder or its {TREE_NAME}")
    return _read(path)


def _read(path: Path) -> TreePlans:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid tree file ({e!r}); delete it or run draftheads calibrate again") from None
    try:
        return from_json(data, str(path))
    except ValueError as e:
        text = str(e)
        if "calibrate" not in text:
            text += "; fix it, delete it or run draftheads calibrate again"
        raise ValueError(text) from None


def write_plans(folder: str | os.PathLike, plans: TreePlans) -> Path:
    """Write ``plans`` as ``folder/tree.json`` in the current format, atomically."""
    path = tree_file(folder)
    write_json_atomically(path, plans.to_json())
    return path


def plans_json(plans: TreePlans) -> str:
    """The file's text (for writers that assemble a whole folder at once)."""
    return json.dumps(plans.to_json(), indent=2) + "\n"
