"""The report's tables (one list, rendered as Markdown here and as HTML by `html`); `compare` as Markdown."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cg_dspy.clbench.lengths import LENGTH_BINS
from cg_dspy.core import files
from cg_dspy.judge.types import RUBRIC_TYPES
from cg_dspy.reports import statistics
from cg_dspy.reports.analysis import NEAR_MISS_BINS
from cg_dspy.reports.report import Rate, Report

MARKER = "<!-- contextguard report -->"  # first line of every Markdown report: how one of ours is known
KIND = files.Kind("a contextguard Markdown report", MARKER.encode())


def cell(value) -> str:
    """A table cell's text, in Markdown and HTML alike."""
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _fmt(value) -> str:
    """A Markdown cell; text from files cannot break the table (| and newlines escaped) or
    open HTML on the page (< as an entity; the arrows of titles stay readable)."""
    return " ".join(cell(value).split()).replace("<", "&lt;").replace("|", "\\|")


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(_fmt(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def interval(ci) -> str:
    """A 95% interval as a reader writes it: [2.24, 47.09]."""
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "–"


def rate(cell: Rate) -> str:
    """A rate with its interval and counts: 12.50 [2.24, 47.09] (1/8)."""
    if cell.task_solving_rate is None:
        return "–"
    return f"{cell.task_solving_rate:.2f} {interval(cell.ci95)} ({cell.solved}/{cell.tasks})"


def p_value(p: float | None) -> str:
    """A p-value in the precision that matters: 0.032, 1.5e-08."""
    return "–" if p is None else f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def difference(value: float | None, ci) -> str:
    """A paired difference in points with its interval: +4.21 [2.77, 5.68]."""
    return "–" if value is None else f"{value:+.2f} {interval(ci)}"


def _rates(title: str, cells: dict[str, dict[str, Rate]], key: str) -> Table:
    names = list(cells)
    groups = sorted({g for run in cells.values() for g in run}, key=lambda g: (
        LENGTH_BINS.index(g) if g in LENGTH_BINS else -1, g))
    rows = [[g, *(rate(cells[n][g]) if g in cells[n] else "–" for n in names)] for g in groups]
    return Table(title, [key.replace("by_", "").replace("_", " "), *names], rows,
                 note="Each cell: task-solving rate (%), its 95% interval, (solved/tasks).")


@dataclass
class Table:
    """One table of the report: what Markdown and HTML both render."""

    title: str
    header: list[str]
    rows: list[list]
    level: int = 3
    note: str = ""


COST_KEYS = ("lm_calls_per_task", "cached_answers_per_task", "prompt_tokens_per_task", "prefilled_tokens_per_task",
             "completion_tokens_per_task", "truncated_replies_per_task", "seconds_per_task")


def tables(report: Report) -> list[Table]:
    """The report's tables, in the order of the paper's tables."""
    runs = report.runs
    names = list(runs)
    out = [Table("Task-solving rate (%)", ["run", "tasks", "solved", "TSR", "TSR 95% CI", "rubric pass rate",
                                            "rubric pass 95% CI"],
                 [[n, r.rate.tasks, r.rate.solved, r.rate.task_solving_rate, interval(r.rate.ci95), r.rubric_pass_rate,
                   interval(r.rubric_pass_rate_ci95)] for n, r in runs.items()], level=2,
                 note="Intervals are 95%: Wilson's for the task-solving rate, a bootstrap over tasks for the rubric "
                      "pass rate (a task's requirements are judged together).")]
    if report.repeats:
        categories = sorted({c for r in report.repeats.values() for c in r.by_category})
        out.append(Table("Repeated runs: task-solving rate, mean ± std", ["run", "repeats", "tasks", "mean ± std",
                                                                       "per run", *categories],
                         [[n, r.runs, r.tasks, _mean_std(*r.mean_std), ", ".join(f"{x:.2f}" for x in r.rates),
                           *(_mean_std(*statistics.mean_std(r.by_category.get(c, []))) for c in categories)]
                          for n, r in report.repeats.items()],
                         note="Sample standard deviation (n - 1) over the repeats, as CL-bench's leaderboard prints "
                              "it. The other tables read each task's majority outcome over its repeats."))
    for key, title in (("by_category", "By category"), ("by_sub_category", "By sub-category"),
                       ("by_length_bin", "By input length (cl100k_base tokens)")):
        out.append(_rates(title, {n: getattr(r, key) for n, r in runs.items()}, key))
    out.append(Table("Near-miss distribution (tasks by unsatisfied requirements)", ["run", *NEAR_MISS_BINS],
                     [[n, *r.near_miss.values()] for n, r in runs.items()]))
    out.append(Table("Failure rate by requirement type (%, task-averaged)", ["type", *names],
                     [[t, *(runs[n].rubric_type_failure[t] for n in names)] for t in RUBRIC_TYPES],
                     note=f"Requirement types by the {report.rubric_typer} typer."))
    if report.comparisons:
        out.append(Table("Paired comparisons (tasks both runs hold)",
                         ["before -> after", "tasks", "Δ TSR (points) [95% CI]", "McNemar p", "newly solved",
                          "broken", "Δ rubric pass rate [95% CI]", "left out"],
                         [[c.title, c.paired.tasks, difference(c.paired.delta, c.paired.ci95),
                           p_value(c.paired.mcnemar_p), c.paired.newly, c.paired.broken,
                           difference(c.delta_rubric_pass_rate, c.delta_rubric_pass_rate_ci95),
                           c.tasks_only_before + c.tasks_only_after] for c in report.comparisons], level=2,
                         note="Δ TSR: Newcombe's paired 95% interval; McNemar p: exact two-sided test of newly solved "
                              "against broken tasks; Δ rubric pass rate: paired bootstrap over tasks. An interval "
                              "that holds 0 (or p ≥ 0.05) means the runs are not shown to differ."))
    for c in report.comparisons:
        out.append(Table(f"{c.title}: migration (rows: before, columns: after)", ["before \\ after", *NEAR_MISS_BINS],
                         [[b, *c.migration[b].values()] for b in NEAR_MISS_BINS], level=2))
        out.append(Table(f"{c.title}: repair and regression", ["measure", "value"],
                         [[k, v] for k, v in c.repair.items()]))
    if report.cost:
        out.append(Table("Generation cost per task", ["run", *COST_KEYS],
                         [[n, *(c[k] for k in COST_KEYS)] for n, c in report.cost.items()]))
    for name, s in (report.judge_stability or {}).items():
        out.append(Table(f"Judge stability: {name} (K = {s['votes']}, every vote drawn)",
                         ["level", "instances", "single-vote agreement", "majority-vote agreement"],
                         [[lvl, s[lvl]["instances"], s[lvl]["single_vote_agreement"],
                           s[lvl]["majority_vote_agreement"]] for lvl in ("requirement", "task")]))
    if report.judge_stability_reason:
        out.append(Table("Judge stability", [], [], note=report.judge_stability_reason))
    for note in report.notes:
        out.append(Table("Note", [], [], note=note))
    return out


def _mean_std(mean: float | None, std: float | None) -> str:
    if mean is None:
        return "–"
    return f"{mean:.2f}" + (f" ± {std:.2f}" if std is not None else "")


def to_markdown(report: Report) -> str:
    """The report as Markdown tables, in the order of the paper's tables."""
    out = [MARKER]
    for t in tables(report):
        out.append(f"{'#' * t.level} {_fmt(t.title)}\n")
        if t.header:
            out.append(_table(t.header, t.rows) + "\n")
        if t.note:
            out.append(_fmt(t.note) + "\n")
    return "\n".join(out)


def compare_markdown(result: dict) -> str:
    """`contextguard compare` as Markdown: each stage's prompt versions with their dev
    scores and the diff of instructions and demos, then one compact table per run kind."""
    out = []
    for stage, cell in result["stages"].items():
        header = ["version", "variant", "run", "optimizer", "dev tasks", "dev TSR before", "dev TSR after [95% CI]",
                  "Δ vs untuned (points) [95% CI]", "McNemar p", "demos"]
        rows = [[v["version"], v["variant"], v["run_id"][:8], v["optimizer"], v.get("dev_tasks"), v["dev_before"],
                 "–" if v["dev_after"] is None else f"{v['dev_after']:.2f} {interval(v.get('dev_after_ci95'))}",
                 difference(v.get("dev_delta"), v.get("dev_delta_ci95")), p_value(v.get("dev_mcnemar_p")),
                 v["demos"]] for v in cell["versions"]]
        out += [f"## contextguard.{stage}\n", _table(header, rows),
                "\nEach tuned version against the untuned program on the same dev tasks, paired. A difference whose "
                "interval holds 0 is not shown to be real: pick a variant on a split large enough "
                "(`contextguard split` says what it can detect).",
                f"\n### instructions, v{cell['a']} -> v{cell['b']}\n",
                _fenced(cell["instructions_diff"] or "(unchanged)"),
                f"\n### demos, v{cell['a']} -> v{cell['b']}\n",
                _fenced(cell["demos_diff"] or "(unchanged)") + "\n"]
    if not result["stages"]:
        out.append("No stage has a tuned version in the Prompt Registry yet (run `contextguard optimize`).\n")
    for kind, rows in result["runs"].items():
        header = list(rows[0])
        out += [f"## {kind} runs\n", _table(header, [[r.get(h) for h in header] for r in rows]), ""]
    return "\n".join(out) + "\n"


def _fenced(text: str, lang: str = "diff") -> str:
    """A code block whose fence is longer than any run of backticks inside it, so text
    from the registry cannot close it early."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"
