"""The paper's figures from a report dict: Figure 3, Figure 4 and Table 14's heatmap."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402

from cg_dspy.evaluation.data import LENGTH_BINS  # noqa: E402
from cg_dspy.method.schemas import CATEGORIES  # noqa: E402
from cg_dspy.reports.analysis import NEAR_MISS_BINS  # noqa: E402


def subcategory_plot(result: dict, path: Path) -> None:
    """Figure 3: TSR per sub-category, ordered and shaded by macro-category."""
    runs = result["runs"]
    names = list(runs)
    cats = {s: cell["category"] for r in runs.values() for s, cell in r["by_sub_category"].items()}
    order = {c: i for i, c in enumerate(CATEGORIES)}
    subs = sorted(cats, key=lambda s: (order.get(cats[s], 9), s))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(subs) * max(1, len(names)) + 2), 4.5))
    width = 0.8 / max(1, len(names))
    shades = plt.get_cmap("Pastel2")
    for cat in dict.fromkeys(cats[s] for s in subs):
        idx = [i for i, s in enumerate(subs) if cats[s] == cat]
        ax.axvspan(idx[0] - 0.5, idx[-1] + 0.5, color=shades(order.get(cat, 7)), alpha=0.5, lw=0)
        ax.text((idx[0] + idx[-1]) / 2, 103, cat, ha="center", va="bottom", fontsize=8)
    for i, name in enumerate(names):
        values = [(runs[name]["by_sub_category"].get(s) or {}).get("task_solving_rate") or 0 for s in subs]
        ax.bar([j - 0.4 + width * (i + 0.5) for j in range(len(subs))], values, width, label=name)
    ax.set_xticks(range(len(subs)), subs, rotation=35, ha="right")
    ax.set_xlim(-0.5, len(subs) - 0.5)
    ax.set_ylim(0, 112)
    ax.set_ylabel("Task-solving rate (%)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def length_plot(result: dict, path: Path) -> None:
    """Figure 4: TSR per input-length bin; the band shows last run's gain over the first."""
    runs = result["runs"]
    names = list(runs)
    bins = [b for b in LENGTH_BINS if any(b in r["by_length_bin"] for r in runs.values())]
    fig, ax = plt.subplots(figsize=(7, 4))
    series = {}
    for name in names:
        series[name] = [(runs[name]["by_length_bin"].get(b) or {}).get("task_solving_rate") or 0 for b in bins]
        ax.plot(bins, series[name], marker="o", label=name)
    if len(names) >= 2:
        first, last = series[names[0]], series[names[-1]]
        ax.fill_between(bins, first, last, alpha=0.15, label=f"gain of {names[-1]}")
        for x, a, b in zip(bins, first, last):
            ax.annotate(f"Δ{b - a:+.1f}", (x, max(a, b)), textcoords="offset points", xytext=(0, 6), ha="center")
    ax.set_xlabel("Input length (cl100k_base tokens)")
    ax.set_ylabel("Task-solving rate (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def migration_plot(result: dict, path: Path) -> None:
    """Table 14 as a heatmap: tasks by failed requirements before (rows) and after."""
    matrix = result["comparison"]["migration"]
    values = [[matrix[b][a] for a in NEAR_MISS_BINS] for b in NEAR_MISS_BINS]
    fig, ax = plt.subplots(figsize=(5, 4))
    im = ax.imshow(values, cmap="Blues")
    top = max(max(row) for row in values) or 1
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center", color="white" if v > top / 2 else "black")
    names = list(result["runs"])
    ax.set_xticks(range(len(NEAR_MISS_BINS)), NEAR_MISS_BINS)
    ax.set_yticks(range(len(NEAR_MISS_BINS)), NEAR_MISS_BINS)
    ax.set_xlabel(f"failed requirements after ({names[1]})")
    ax.set_ylabel(f"failed requirements before ({names[0]})")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_all(result: dict, directory: str | Path) -> list[Path]:
    """Every figure the report supports; returns the files written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "tsr_by_sub_category.png", out / "tsr_by_length.png"]
    subcategory_plot(result, written[0])
    length_plot(result, written[1])
    if "comparison" in result:
        written.append(out / "migration.png")
        migration_plot(result, written[-1])
    return written
