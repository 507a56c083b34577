"""`contextguard bench`: several methods run and judged on the same tasks, paired.

Pairing follows the paper: Self-Refine and ContextGuard without the reminder revise
the baseline's own draft; ContextGuard's other ablations and its edit mode revise the full method's
reminder draft. Everything lands in one folder: `<method>.jsonl`,
`<method>.graded.jsonl`, `report.json`, `report.md`, `report.html` and `figures/`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cg_dspy.clbench import generation, grading
from cg_dspy.clbench.rows import row_id
from cg_dspy.method import build_program
from cg_dspy.method.program import ABLATIONS
from cg_dspy.reports import analysis, outputs
from cg_dspy.reports.report import Report
from cg_dspy.workflows import Tracking, tracked


@dataclass
class BenchResult:
    """The report over every method, what did not finish, and what tracing lost."""

    report: Report | None = None
    failed: list[tuple[str, str]] = field(default_factory=list)  # (method: task, reason)
    interrupted: bool = False
    warnings: list[str] = field(default_factory=list)


def draft_source(method: str) -> str | None:
    """Which method's drafts a method revises, for paired comparisons."""
    if method in ("self-refine", "contextguard-no-reminder"):
        return "baseline"
    if method.startswith("contextguard-no-") or method == "contextguard-edit":
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


def bench(tasks, methods, out_dir: Path, *, tracking: Tracking = Tracking(enabled=False), params: dict | None = None,
          **options) -> BenchResult:
    """`run_bench` as one MLflow run: every task traced, each run's metrics, the folder as
    artifacts."""
    with tracked(tracking, f"bench-{Path(out_dir).name}", "bench", params or {}) as run_:
        with run_.traced(tracking.trace):
            result = run_bench(tasks, methods, Path(out_dir), **options)
        result.warnings = run_.warnings
        if run_.active:
            from cg_dspy import tracking as mlflow_tracking

            mlflow_tracking.log_metrics(run_.traced_counts(), prefix="traces.")
            if result.report is not None:
                mlflow_tracking.log_report(result.report, per_run=True)
                mlflow_tracking.log_artifacts(out_dir, "bench")
            if result.interrupted:
                run_.stopped_early()
    return result


def run_bench(tasks, methods, out_dir: Path, *, lm, judge_lm, votes=3, protocol="rubric", threads=4,
              progress=True, early_stop=True, force=False, resume_anyway=False, inputs=(),
              layout="chat", policy=None, typer=None, repeats: int = 1) -> BenchResult:
    """Run, judge and report every method into `out_dir`; `typer` (an `LMTyper`) types the
    requirements for Table 2 instead of the keyword cues. With `repeats`, every method
    runs that many times (`<method>.r<i>.jsonl`), repeat i of a method revising repeat i
    of its draft source; the report reads them as repeats (mean ± std)."""
    outputs.check(out_dir)  # before any work: the report files must be ours
    out_dir.mkdir(parents=True, exist_ok=True)
    answers: dict[tuple[str, int | None], dict[str, str]] = {}
    graded_files: dict[str, tuple[str, list[dict]]] = {}  # path -> (method, rows)
    result = BenchResult()
    for method in ordered(methods):
        src = draft_source(method)
        for repeat in [None] if repeats == 1 else range(1, repeats + 1):
            out = out_dir / f"{method}.jsonl"
            out = generation.repeat_path(out, repeat) if repeat else out
            run = generation.run(build_program(method, layout=layout, policy=policy), tasks, out, lm=lm, method=method,
                              threads=threads, drafts=answers.get((src, repeat)), progress=progress, force=force,
                              resume_anyway=resume_anyway, inputs=inputs, repeat=repeat)
            result.failed += [(f"{out.stem}: {idx}", reason) for idx, reason in run.outcome.failed]
            if run.outcome.interrupted:
                result.interrupted = True
                return result
            answers[(method, repeat)] = {row_id(r): r.get("trace", {}).get("draft") or r["model_output"]
                                         for r in run.rows}
            graded = grading.grade_file(run.rows + [r for r in run.outcome.rows if r.get("error")],
                                      str(out.with_suffix(".graded.jsonl")), judge_lm=judge_lm, protocol=protocol,
                                      votes=votes, early_stop=early_stop, threads=threads, progress=progress,
                                      force=force, resume_anyway=resume_anyway)
            result.failed += [(f"{out.stem} (grading): {idx}", reason) for idx, reason in graded.outcome.failed]
            if graded.outcome.interrupted:
                result.interrupted = True
                return result
            graded_files[str(out.with_suffix(".graded.jsonl"))] = (method, graded.rows)
    # In reading order, named as `report` names the same files ("contextguard (no audit)").
    files = {path: rows for path, (method, rows) in sorted(graded_files.items(),
                                                            key=lambda item: reading_order(item[1][0]))}
    typed = {}
    if typer is not None:
        typer.type_files({path: [r for row in rows for r in row.get("rubrics") or []] for path, rows in files.items()})
        typed = {"typer": typer, "typer_name": typer.describe()}
    labelled = analysis.label_files(files)
    runs = labelled.runs
    # each method against the baseline, and edit mode against the rewrite it shares drafts
    # with, paired (repeats by their per-task majority)
    pairs = [("baseline", m) for m in runs if m != "baseline"] if "baseline" in runs else []
    if {"contextguard", "contextguard (edit)"} <= set(runs):
        pairs.append(("contextguard", "contextguard (edit)"))
    report = analysis.report(runs, repeats=labelled.repeats, notes=labelled.notes, pairs=pairs, **typed)
    outputs.write(report, out_dir)
    result.report = report
    return result
