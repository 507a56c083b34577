"""`contextguard bench`: several methods run and judged on the same tasks, paired.

Pairing follows the paper: Self-Refine and ContextGuard without the reminder revise
the baseline's own draft; ContextGuard's other ablations revise the full method's
reminder draft. Everything lands in one folder: `<method>.jsonl`,
`<method>.graded.jsonl`, `report.json`, `report.md`, `report.html` and `figures/`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from cg_dspy.evaluation import harness, judge
from cg_dspy.method import build_program
from cg_dspy.method.program import ABLATIONS
from cg_dspy.reports import analysis, html, markdown, plots


@dataclass
class BenchResult:
    """The report over every method, and what did not finish."""

    report: dict
    failed: list[tuple[str, str]] = field(default_factory=list)  # (method: task, reason)
    interrupted: bool = False


def draft_source(method: str) -> str | None:
    """Which method's drafts a method revises, for paired comparisons."""
    if method in ("self-refine", "contextguard-no-reminder"):
        return "baseline"
    if method.startswith("contextguard-no-"):
        return "contextguard"
    return None


def ordered(methods: list[str]) -> list[str]:
    """Methods whose drafts others reuse run first; needed sources are added."""
    wanted = list(dict.fromkeys(methods))
    for m in list(wanted):
        src = draft_source(m)
        if src and src not in wanted:
            wanted.insert(0, src)
    return sorted(wanted, key=lambda m: (m != "baseline", m != "contextguard"))


def reading_order(method: str) -> tuple[int, int]:
    """How a reader expects methods in tables and figures: the baseline, Self-Refine,
    ContextGuard, then its ablations in the paper's order."""
    main = ("baseline", "self-refine", "contextguard")
    if method in main:
        return main.index(method), 0
    removed = method.removeprefix("contextguard-no-")
    return len(main), ABLATIONS.index(removed) if removed in ABLATIONS else len(ABLATIONS)


def run_bench(tasks, methods, out_dir: Path, *, lm, judge_lm, votes=3, protocol="rubric", threads=4,
              progress=True, early_stop=True, force=False, resume_anyway=False, inputs=(),
              layout="chat", typer=None) -> BenchResult:
    """Run, judge and report every method into `out_dir`; `typer` (an `LMTyper`) types the
    requirements for Table 2 instead of the keyword cues."""
    out_dir.mkdir(parents=True, exist_ok=True)
    answers: dict[str, dict[str, str]] = {}
    graded_runs: dict[str, list[dict]] = {}
    result = BenchResult(report={})
    for method in ordered(methods):
        src = draft_source(method)
        run = harness.run(build_program(method, layout=layout), tasks, out_dir / f"{method}.jsonl", lm=lm,
                          method=method, threads=threads, drafts=answers.get(src), progress=progress, force=force,
                          resume_anyway=resume_anyway, inputs=inputs)
        result.failed += [(f"{method}: {idx}", reason) for idx, reason in run.outcome.failed]
        if run.outcome.interrupted:
            result.interrupted = True
            return result
        answers[method] = {r["idx"]: r.get("trace", {}).get("draft") or r["model_output"] for r in run.rows}
        graded = judge.grade_file(run.rows + [r for r in run.outcome.rows if r.get("error")],
                                  str(out_dir / f"{method}.graded.jsonl"), judge_lm=judge_lm, protocol=protocol,
                                  votes=votes, early_stop=early_stop, threads=threads, progress=progress,
                                  force=force, resume_anyway=resume_anyway)
        result.failed += [(f"{method} (grading): {idx}", reason) for idx, reason in graded.outcome.failed]
        if graded.outcome.interrupted:
            result.interrupted = True
            return result
        graded_runs[method] = graded.rows
    order = sorted(graded_runs, key=reading_order)
    typed = {}
    if typer is not None:
        typer.type_files({str(out_dir / f"{m}.graded.jsonl"): graded_runs[m] for m in order})
        typed = {"typer": typer, "typer_name": typer.describe()}
    # In reading order, named as `report` names the same files ("contextguard (no audit)").
    graded_runs = {analysis.method_label(m): graded_runs[m] for m in order}
    report = analysis.report(graded_runs, **typed)
    base = "baseline" if "baseline" in graded_runs else None
    if base:
        report["comparisons"] = {f"{base} -> {m}": analysis.compare(graded_runs[base], g)
                                 for m, g in graded_runs.items() if m != base}
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out_dir / "report.md").write_text(markdown.to_markdown(report), encoding="utf-8")
    drawn = plots.rendered(report)  # drawn once, for the folder and the page
    plots.write_all(report, out_dir / "figures", drawn)
    html.write(report, out_dir / "report.html", drawn)
    result.report = report
    return result
