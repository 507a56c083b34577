"""The paper's figures from a report dict, each readable at a glance.

Figure 3 (sub-categories), Figure 4 (input length), Table 13 as bars (near-miss per
run), Table 2 as bars (failure per requirement type) and Table 14 as a heatmap. Every
figure starts its value axis at zero, writes the value on each bar, keeps its legend
inside, and gives a run the same colour in every figure (`colour`). Each drawing
function returns what it drew, read back from the bars, so tests compare the picture's
numbers with the report's tables.
"""

from __future__ import annotations

import functools
import io
import textwrap
import zlib
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402

from cg_dspy.clbench.lengths import LENGTH_BINS  # noqa: E402
from cg_dspy.core import files  # noqa: E402
from cg_dspy.core.messages import category_order  # noqa: E402
from cg_dspy.judge.types import RUBRIC_TYPES  # noqa: E402
from cg_dspy.method.program import ABLATIONS  # noqa: E402
from cg_dspy.reports.analysis import NEAR_MISS_BINS  # noqa: E402
from cg_dspy.reports.report import Comparison, Rate, Report  # noqa: E402

DPI = 110
# One colour per method and per ContextGuard ablation, the same in every figure.
METHOD_COLOURS = {"baseline": "#8c8c8c", "self-refine": "#e6862e", "contextguard": "#2f6db3"}
ABLATION_COLOURS = dict(zip(ABLATIONS, ("#9b6bc2", "#c8423b", "#3f9e4d", "#22a5b8", "#8a5a44")))
OTHER_COLOURS = ("#d17aae", "#a6a33a", "#5c5c8a", "#b39b2f", "#4d8f8f")
EXTRA_COLOURS = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#a6761d", "#666666", "#1f78b4", "#b2df8a",
                 "#fb9a99", "#cab2d6")


def colour(label: str) -> str:
    """A run's colour from its label ("contextguard (no protection)", "baseline [a.jsonl]");
    a label that names no method or single ablation (file names, several ablations) takes
    a colour of a fixed list chosen by the label itself, so it is the same in every figure."""
    plain = label.split(" [")[0]
    base, _, rest = plain.partition(" (")
    removed = [part.strip().removeprefix("no ") for part in rest.rstrip(")").split(",")] if rest else []
    if base in METHOD_COLOURS and not removed:
        return METHOD_COLOURS[base]
    if base == "contextguard" and len(removed) == 1 and removed[0] in ABLATION_COLOURS:
        return ABLATION_COLOURS[removed[0]]
    return OTHER_COLOURS[zlib.crc32(plain.encode()) % len(OTHER_COLOURS)]


def _colours(names: list[str]) -> dict[str, str]:
    """Each run its colour; two runs that would share one (the same method from two files,
    many file-named runs) take the next colour nobody has."""
    out: dict[str, str] = {}
    spare = [c for c in (*OTHER_COLOURS, *EXTRA_COLOURS) if c not in {colour(n) for n in names}]
    for name in names:
        wanted = colour(name)
        out[name] = wanted if wanted not in out.values() else spare.pop(0) if spare else wanted
    return out


def _versus(names: list[str]) -> str:
    """What a title says is compared: the runs' names when they fit, else how many."""
    text = " vs ".join(names)
    return text if len(names) <= 3 and len(text) <= 60 else f"{len(names)} runs (legend below)"


def _grouped_bars(ax, groups: list[str], series: dict[str, list[float | None]], colours: dict[str, str], *,
                  horizontal: bool, fmt=lambda name, v: f"{v:.1f}", fontsize: float = 8, blank=(),
                  errors: dict[str, list] | None = None) -> None:
    """Bars per group, one per series, each labelled with its value (– when absent; nothing
    on the groups in `blank`, which are headings). `errors` gives a series' 95% intervals
    ([lo, hi] per group, None where there is none): drawn as error bars, the value label
    just past the interval's end so the two never cross."""
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        shown = [g for g in range(len(groups)) if g not in blank]
        pos = [g - 0.4 + width * (i + 0.5) for g in shown]
        heights = [values[g] or 0 for g in shown]
        cis = [(errors or {}).get(name, [None] * len(groups))[g] if values[g] is not None else None for g in shown]
        spread = [[h - ci[0] if ci else 0 for h, ci in zip(heights, cis)],
                  [ci[1] - h if ci else 0 for h, ci in zip(heights, cis)]]
        bar_errors = {("xerr" if horizontal else "yerr"): spread} if any(cis) else {}
        draw = ax.barh if horizontal else ax.bar
        draw(pos, heights, width * 0.92, label=name, color=colours[name], **bar_errors,
             error_kw={"elinewidth": 0.8, "capsize": 2, "ecolor": "#333333"})
        for g, at, h, ci in zip(shown, pos, heights, cis):
            end = ci[1] if ci else h
            text = fmt(name, values[g]) if values[g] is not None else "–"
            ax.annotate(text, (end, at) if horizontal else (at, end), xytext=(3, 0) if horizontal else (0, 2),
                        textcoords="offset points", ha="left" if horizontal else "center",
                        va="center" if horizontal else "bottom", fontsize=fontsize,
                        rotation=0 if horizontal or n <= 3 else 90)


def _value_axis(ax, values, *, horizontal: bool, room: float = 1.18, label: str) -> None:
    top = max([v for v in values if v is not None] or [0]) or 1
    (ax.set_xlim if horizontal else ax.set_ylim)(0, top * room)
    (ax.set_xlabel if horizontal else ax.set_ylabel)(label)
    ax.grid(axis="x" if horizontal else "y", alpha=0.3)
    ax.set_axisbelow(True)


def literal_text(draw):
    """Draw with every text taken literally: a category named "Tuition $#1 vs $#2" or
    "Pricing $5-$10" is not matplotlib math (which fails, or renders italics)."""

    @functools.wraps(draw)
    def drawn_literally(*args, **kwargs):
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return drawn_literally


def _figure(width: float, height: float):
    """A figure whose layout keeps titles, labels and the legend apart."""
    return plt.subplots(layout="constrained", figsize=(width, height))


def _legend(fig, names: list[str]) -> None:
    """Runs named once, below the plot and inside the figure, never over a bar; long labels
    (file names, several ablations) take fewer columns and wrap."""
    width = max(len(n) for n in names)
    columns = min(len(names), 4 if width <= 24 else 2 if width <= 44 else 1)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, [textwrap.fill(label, 56) for label in labels], loc="outside lower center",
               ncol=columns, fontsize=8, frameon=False)


def _bar_chart(series: dict[str, list], ticks: list[str], *, size: tuple[float, float], horizontal: bool,
               title: str, value_label: str, room: float = 1.18, blank=(), title_size: float | None = None,
               **bar_options):
    """The one shape of every bar figure: grouped bars with their values, ticks along the
    groups (top to bottom when horizontal), a value axis from zero, a title and the legend."""
    names = list(series)
    fig, ax = _figure(*size)
    _grouped_bars(ax, ticks, series, _colours(names), horizontal=horizontal, blank=blank, **bar_options)
    (ax.set_yticks if horizontal else ax.set_xticks)(range(len(ticks)), ticks)
    if horizontal:
        ax.invert_yaxis()
    highs = [ci[1] for cis in (bar_options.get("errors") or {}).values() for ci in cis if ci]
    _value_axis(ax, [v for vs in series.values() for v in vs] + highs, horizontal=horizontal, room=room,
                label=value_label)
    fig.suptitle(title, fontsize=title_size)
    _legend(fig, names)
    return fig, ax


@literal_text
def subcategory_figure(report: Report):
    """Figure 3: TSR per sub-category, grouped under their macro-category (horizontal bars,
    so long names stay readable)."""
    runs = report.runs
    names = list(runs)
    cats = {s: cell.category for r in runs.values() for s, cell in r.by_sub_category.items()}
    subs = sorted(cats, key=lambda s: (category_order(cats[s]), s))
    rows: list[str] = []  # top to bottom: a category heading, then its sub-categories
    headings: set[int] = set()
    for cat in dict.fromkeys(cats[s] for s in subs):
        headings.add(len(rows))
        rows += [cat] + [s for s in subs if cats[s] == cat]
    cells = {n: [None if i in headings else runs[n].by_sub_category.get(r) for i, r in enumerate(rows)]
             for n in names}
    series, errors = _rates(cells)
    fig, ax = _bar_chart(series, rows, size=(9, 1.2 + 0.22 * len(rows) * max(1.6, len(names) * 0.9)),
                         horizontal=True, blank=headings, value_label="Task-solving rate (%; whiskers: 95% interval)",
                         title=f"Task-solving rate by sub-category: {_versus(names)}", errors=errors)
    for i, tick in enumerate(ax.get_yticklabels()):
        if i in headings:
            tick.set_fontweight("bold")  # a macro-category heading, its sub-categories below
    return fig


def gain_pair(names: list[str]) -> tuple[str, str]:
    """Whose gain over whom Figure 4 writes: ContextGuard over the baseline when both ran,
    else the last run over the first."""
    base = "baseline" if "baseline" in names else names[0]
    return base, "contextguard" if "contextguard" in names else names[-1]


def paired_gain(report: Report, first: str, last: str, length_bin: str) -> tuple[float, list[float]] | None:
    """`last` minus `first` in one length bin with its paired 95% interval, when the
    report compares the two (either way round) over the very tasks the bars show; else
    None (the bars' own difference is written, without an interval)."""
    shown = {report.runs[n].by_length_bin[length_bin].tasks for n in (first, last)}
    for (before, after), sign in (((first, last), 1), ((last, first), -1)):
        found = report.comparison(before, after)
        cell = found.by_length_bin.get(length_bin) if found else None
        if cell and shown == {cell.tasks}:
            lo, hi = cell.ci95
            return sign * cell.delta, [lo, hi] if sign > 0 else [-hi, -lo]
    return None


def _rates(cells: dict[str, list[Rate | None]]) -> tuple[dict, dict]:
    """Bar lengths and whiskers of rate cells (None where a run has no cell)."""
    series = {n: [c.task_solving_rate if c else None for c in row] for n, row in cells.items()}
    errors = {n: [c.ci95 if c else None for c in row] for n, row in cells.items()}
    return series, errors


@literal_text
def length_figure(report: Report):
    """Figure 4: TSR per input-length bin, bars per run with their 95% intervals; the
    gain of `gain_pair` is written above each bin, with its paired interval when the
    report pairs the two runs."""
    runs = report.runs
    names = list(runs)
    bins = [b for b in LENGTH_BINS if any(b in r.by_length_bin for r in runs.values())]
    series, errors = _rates({n: [runs[n].by_length_bin.get(b) for b in bins] for n in names})
    first, last = gain_pair(names)
    fig, ax = _bar_chart(series, bins, size=(max(6.0, 1.6 + 1.3 * len(bins) * max(1, len(names)) ** 0.5), 4.6),
                         horizontal=False, room=1.42, value_label="Task-solving rate (%; whiskers: 95% interval)",
                         title_size=10, errors=errors,
                         title=f"Task-solving rate by input length: {_versus(names)}"
                         + (f"\n(Δ: {last} minus {first}, points, [paired 95% interval])" if first != last else ""))
    if first != last:
        top = ax.get_ylim()[1]
        for x, (b, a, length) in enumerate(zip(series[first], series[last], bins)):
            if b is not None and a is not None:
                gain = paired_gain(report, first, last, length)
                delta, ci = (a - b, None) if gain is None else gain
                text = f"Δ {delta:+.1f}" + (f"\n[{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else "")
                ax.text(x, top * 0.97, text, ha="center", va="top", fontsize=8, fontweight="bold",
                        color=colour(last) if last in METHOD_COLOURS else "black")
    ax.set_xlabel("Input length (cl100k_base tokens)")
    return fig


@literal_text
def near_miss_figure(report: Report):
    """Table 13 as bars: tasks per number of unsatisfied requirements, per run (count, share)."""
    runs = report.runs
    series = {n: [runs[n].near_miss[b] for b in NEAR_MISS_BINS] for n in runs}
    totals = {n: sum(series[n]) or 1 for n in runs}
    fig, ax = _bar_chart(series, [f"{b} failed" for b in NEAR_MISS_BINS],
                         size=(max(7.0, 2 + 0.55 * len(NEAR_MISS_BINS) * len(runs)), 4.4), horizontal=False,
                         room=1.3, value_label="tasks", title=f"Near-miss distribution: {_versus(list(runs))}",
                         fmt=lambda name, v: f"{v}\n{100 * v / totals[name]:.1f}%",
                         fontsize=7 if len(runs) > 2 else 8)
    ax.set_xlabel("Unsatisfied requirements per task (0 = solved)")
    return fig


@literal_text
def rubric_type_figure(report: Report):
    """Table 2 as bars: failure rate per requirement type, per run (lower is better)."""
    runs = report.runs
    series = {n: [runs[n].rubric_type_failure[t] for t in RUBRIC_TYPES] for n in runs}
    typer = report.rubric_typer
    fig, _ = _bar_chart(series, list(RUBRIC_TYPES),
                        size=(8.5, 1.4 + 0.5 * len(RUBRIC_TYPES) * max(1.0, len(runs) * 0.6)), horizontal=True,
                        room=1.3, value_label="Failure rate (%, task-averaged within each type; lower is better)",
                        title=f"Failure rate by requirement type: {_versus(list(runs))}\n(types by the {typer} typer)",
                        title_size=10)
    return fig


@literal_text
def migration_figure(comparison: Comparison):
    """Table 14 as a heatmap: tasks by failed requirements before (rows) and after."""
    before, after, matrix = comparison.before, comparison.after, comparison.migration
    values = [[matrix[b][a] for a in NEAR_MISS_BINS] for b in NEAR_MISS_BINS]
    fig, ax = _figure(6.4, 5.0)
    im = ax.imshow(values, cmap="Blues")
    top = max(max(row) for row in values) or 1
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=9,
                    color="white" if v > top / 2 else "black", fontweight="bold" if i == j else None)
    ax.set_xticks(range(len(NEAR_MISS_BINS)), NEAR_MISS_BINS)
    ax.set_yticks(range(len(NEAR_MISS_BINS)), [f"{b} ({sum(r)})" for b, r in zip(NEAR_MISS_BINS, values)])
    ax.set_xlabel(f"failed requirements after: {after}")
    ax.set_ylabel(f"failed requirements before: {before} (tasks)")
    fig.suptitle(f"Near-miss migration: {before} → {after}\n(left of the diagonal: fewer failures)", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="tasks")
    return fig, values


def figures(report: Report) -> dict[str, object]:
    """Every figure the report supports, by file stem, as matplotlib figures."""
    out = {"tsr_by_sub_category": subcategory_figure(report), "tsr_by_length": length_figure(report),
           "near_miss": near_miss_figure(report), "rubric_type_failure": rubric_type_figure(report)}
    for comparison in report.comparisons:
        stem = "migration" if len(report.comparisons) == 1 else f"migration_{_slug(comparison.after)}"
        out[stem] = migration_figure(comparison)[0]
    return out


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text).strip("_")


SOFTWARE = "contextguard report"  # in each PNG's metadata: how a figure of ours is known
FIGURE = files.Kind("a contextguard figure", SOFTWARE.encode())
STEMS = ("tsr_by_sub_category", "tsr_by_length", "near_miss", "rubric_type_failure", "migration")


def _ours_by_name(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.suffix == ".png" and p.stem.startswith(STEMS)]


def check(directory: str | Path) -> Path:
    """Refuse, before any work, a folder that is a file or holds figures that are not ours."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"{out}: --plots names a folder; this is a file")
    if out.is_dir():
        for path in _ours_by_name(out):
            files.check(path, FIGURE)
    return out


@dataclass
class Rendered:
    """One figure as a PNG, with the title a page shows under it."""

    png: bytes
    caption: str


def rendered(report: Report) -> dict[str, Rendered]:
    """Every figure drawn once, as PNG bytes by file stem: what `--plots` writes and the
    HTML page inlines."""
    out = {}
    for stem, fig in figures(report).items():
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": SOFTWARE})
        out[stem] = Rendered(buffer.getvalue(), fig.get_suptitle().replace("\n", " ") or stem)
        plt.close(fig)
    return out


def write_all(report: Report, directory: str | Path, drawn: dict[str, Rendered] | None = None) -> list[Path]:
    """Every figure as a PNG in `directory` (figures of an earlier report that this one
    does not draw are removed); returns the files written."""
    out = check(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, figure in (drawn or rendered(report)).items():
        path = out / f"{stem}.png"
        written.append(files.write(path, figure.png, FIGURE))
    for stale in set(_ours_by_name(out)) - set(written):
        stale.unlink()
    return written
