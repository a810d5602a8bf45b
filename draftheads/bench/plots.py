"""PNG plots of a summary: what a person looks at before reading the table.

matplotlib is an optional dependency (``pip install "draftheads[bench]"``); without it the
report is written without plots and says why.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .methods import PLAIN
from .metrics import OVERALL

SPEEDUP_PNG = "speedup_by_category.png"
ACCEPT_PNG = "accept_lengths.png"
DEPTH_PNG = "acceptance_by_depth.png"


def write_plots(out: Path, results: dict[str, Any], methods: list[str], categories: list[str], title: str) -> list[str]:
    """Writes the three plots into ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # files only: never needs a display
    import matplotlib.pyplot as plt

    written = []
    for name, draw in ((SPEEDUP_PNG, _speedup), (ACCEPT_PNG, _accept_lengths), (DEPTH_PNG, _depth)):
        bars = (len(categories) + 1) * max(1, len(methods)) if name == SPEEDUP_PNG else 0
        fig, ax = plt.subplots(figsize=(min(12.0, max(6.5, 2.0 + 0.22 * bars)), 4.5))
        try:
            draw(ax, results, methods, categories)
            ax.set_title(f"{ax.get_title()}\n{title}", fontsize=9)
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            written.append(name)
        finally:
            plt.close(fig)
    return written


def _speedup(ax, results, methods, categories) -> None:
    groups = [*categories, OVERALL] if len(categories) > 1 else [OVERALL]
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        values = [(results[m]["by_category"].get(g) or {}).get("speedup") or 0.0 for g in groups]
        xs = [j + (i - (len(methods) - 1) / 2) * width for j in range(len(groups))]
        bars = ax.bar(xs, values, width, label=m)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label=f"{PLAIN} generate")
    ax.set_xticks(range(len(groups)), groups, rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center")
    ax.set_ylabel("speedup over plain generate (x)")
    ax.set_title("Speedup by category (mean tokens/s ratio)")
    ax.legend(fontsize=8)


def _accept_lengths(ax, results, methods, categories) -> None:
    hists = {m: {int(k): v for k, v in results[m]["accept_length_histogram"].items()} for m in methods}
    longest = max((max(h) for h in hists.values() if h), default=1)
    width = 0.8 / max(len(methods), 1)
    for i, m in enumerate(methods):
        total = sum(hists[m].values()) or 1
        xs = [length + (i - (len(methods) - 1) / 2) * width for length in range(1, longest + 1)]
        ax.bar(xs, [hists[m].get(length, 0) / total for length in range(1, longest + 1)], width,
               label=f"{m} (mean {results[m]['by_category'][OVERALL]['mean_accepted_tokens'] or 0:.2f})")
    ax.set_xticks(range(1, longest + 1))
    ax.set_xlabel("tokens committed per target forward (bonus token included)")
    ax.set_ylabel("fraction of steps")
    ax.set_title("Distribution of accepted lengths")
    ax.legend(fontsize=8)


def _depth(ax, results, methods, categories) -> None:
    for m in methods:
        by_depth = {int(k): v for k, v in results[m]["acceptance_by_depth"].items()}
        if by_depth:
            depths = sorted(by_depth)
            ax.plot(depths, [by_depth[d] for d in depths], marker="o", label=m)
    ax.set_xlabel("tree depth d (drafted tokens accepted)")
    ax.set_ylabel("fraction of steps reaching depth d")
    ax.set_ylim(0, 1.02)
    ax.set_title("Acceptance rate by tree depth")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
