"""The report's tables (one list, rendered as Markdown here and as HTML by `html`); `compare` as Markdown."""

from __future__ import annotations

from dataclasses import dataclass

from cg_dspy.evaluation.data import LENGTH_BINS
from cg_dspy.reports.analysis import NEAR_MISS_BINS, RUBRIC_TYPES, comparisons


def cell(value) -> str:
    """A table cell's text, in Markdown and HTML alike."""
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _fmt(value) -> str:
    """A Markdown cell; text from files cannot break the table (| and newlines escaped)."""
    return " ".join(cell(value).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(_fmt(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _rates(title: str, runs: dict, key: str) -> Table:
    names = list(runs)
    groups = sorted({g for r in runs.values() for g in r[key]}, key=lambda g: (
        LENGTH_BINS.index(g) if g in LENGTH_BINS else -1, g))
    rows = []
    for g in groups:
        cells = []
        for n in names:
            cell = runs[n][key].get(g)
            cells.append(f"{_fmt(cell['task_solving_rate'])} ({cell['solved']}/{cell['tasks']})" if cell else "–")
        rows.append([g, *cells])
    return Table(title, [key.replace("by_", "").replace("_", " "), *names], rows)


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


def tables(result: dict) -> list[Table]:
    """The report's tables, in the order of the paper's tables."""
    runs = result["runs"]
    names = list(runs)
    out = [Table("Task-solving rate (%)", ["run", "tasks", "solved", "TSR"],
                 [[n, runs[n]["tasks"], runs[n]["solved"], runs[n]["task_solving_rate"]] for n in names], level=2)]
    for key, title in (("by_category", "By category"), ("by_sub_category", "By sub-category"),
                       ("by_length_bin", "By input length (cl100k_base tokens)")):
        out.append(_rates(title, runs, key))
    out.append(Table("Near-miss distribution (tasks by unsatisfied requirements)", ["run", *NEAR_MISS_BINS],
                     [[n, *runs[n]["near_miss"].values()] for n in names]))
    typer = result.get("rubric_typer") or "keyword"
    out.append(Table("Failure rate by requirement type (%, task-averaged)", ["type", *names],
                     [[t, *(runs[n]["rubric_type_failure"][t] for n in names)] for t in RUBRIC_TYPES],
                     note=f"Requirement types by the {typer} typer."))
    for (before, after), c in comparisons(result).items():
        title = f"{before} -> {after}"
        out.append(Table(f"{title}: migration (rows: before, columns: after)", ["before \\ after", *NEAR_MISS_BINS],
                         [[b, *c["migration"][b].values()] for b in NEAR_MISS_BINS], level=2))
        out.append(Table(f"{title}: repair and regression", ["measure", "value"],
                         [[k, v] for k, v in c.items() if k != "migration"]))
    if result.get("cost"):
        out.append(Table("Generation cost per task", ["run", *COST_KEYS],
                         [[n, *(c[k] for k in COST_KEYS)] for n, c in result["cost"].items()]))
    stability = result.get("judge_stability")
    for name, s in (stability or {}).items():
        out.append(Table(f"Judge stability: {name} (K = {s['votes']}, every vote drawn)",
                         ["level", "instances", "single-vote agreement", "majority-vote agreement"],
                         [[lvl, s[lvl]["instances"], s[lvl]["single_vote_agreement"],
                           s[lvl]["majority_vote_agreement"]] for lvl in ("requirement", "task")]))
    if result.get("judge_stability_reason"):
        out.append(Table("Judge stability", [], [], note=result["judge_stability_reason"]))
    return out


def to_markdown(result: dict) -> str:
    """The report as Markdown tables, in the order of the paper's tables."""
    out = []
    for t in tables(result):
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
        header = ["version", "variant", "run", "optimizer", "dev TSR before", "dev TSR after", "demos"]
        rows = [[v["version"], v["variant"], v["run_id"][:8], v["optimizer"], v["dev_before"], v["dev_after"],
                 v["demos"]] for v in cell["versions"]]
        out += [f"## contextguard.{stage}\n", _table(header, rows),
                f"\n### instructions, v{cell['a']} -> v{cell['b']}\n",
                "```diff\n" + (cell["instructions_diff"] or "(unchanged)") + "\n```",
                f"\n### demos, v{cell['a']} -> v{cell['b']}\n",
                "```diff\n" + (cell["demos_diff"] or "(unchanged)") + "\n```\n"]
    if not result["stages"]:
        out.append("No stage has a tuned version in the Prompt Registry yet (run `contextguard optimize`).\n")
    for kind, rows in result["runs"].items():
        header = list(rows[0])
        out += [f"## {kind} runs\n", _table(header, [[r.get(h) for h in header] for r in rows]), ""]
    return "\n".join(out) + "\n"
