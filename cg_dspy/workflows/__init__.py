"""What a command does, as a library: `run`, `evaluate`, `bench` (workflows.bench),
`optimize` (workflows.optimize) and `compare`. Each is one `with tracked(...)` block:
the work, traced by task when tracking is on, then its results logged to one MLflow run
that ends FINISHED, KILLED (stopped early) or FAILED. The CLI parses arguments, calls
these and prints; nothing here prints.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from cg_dspy.clbench import generation, grading
from cg_dspy.clbench.generation import RunResult
from cg_dspy.clbench.grading import GradeResult
from cg_dspy.reports import analysis
from cg_dspy.reports.render import markdown
from cg_dspy.reports.report import Report


@dataclass(frozen=True)
class Tracking:
    """Where a workflow's MLflow run goes: `enabled=False` logs nothing; `trace=False`
    logs the run without a trace per task."""

    enabled: bool = True
    uri: str | None = None
    experiment: str = "contextguard"
    trace: bool = True


class Tracked:
    """A workflow's MLflow run (or none), its traces, and what they lost."""

    def __init__(self, handle):
        self.handle = handle
        self.traces = None  # the trace report, once the traced block ended
        self.warnings: list[str] = []

    @property
    def active(self) -> bool:
        return self.handle is not None

    @property
    def run_id(self) -> str | None:
        return self.handle.info.run_id if self.handle is not None else None

    @contextmanager
    def traced(self, enabled: bool) -> Iterator[None]:
        """Every task in this block traced (when the run is tracked and `enabled`)."""
        if not self.active or not enabled:
            yield
            return
        from cg_dspy import tracking

        with tracking.tracing() as report:
            yield
        self.traces = report
        if report.warning():
            self.warnings.append(report.warning())

    def traced_counts(self) -> dict:
        return self.traces.as_dict() if self.traces is not None else {}

    def stopped_early(self) -> None:
        if self.handle is not None:
            self.handle.stopped_early()


@contextmanager
def tracked(settings: Tracking, name: str, kind: str, params: dict) -> Iterator[Tracked]:
    """One MLflow run of `kind` named `name` with `params` (none when tracking is off)."""
    if not settings.enabled:
        yield Tracked(None)
        return
    from cg_dspy import tracking

    tracking.setup(settings.uri, settings.experiment)
    with tracking.run(name, kind=kind, params=params) as handle:
        yield Tracked(handle)


@dataclass
class RunsDone:
    """What `run` did, per output file (one, or one per repeat)."""

    results: dict[str, RunResult] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return any(r.outcome.interrupted for r in self.results.values())


def run(program, tasks, out: str | os.PathLike, *, lm, method: str, repeats: int = 1,
        tracking: Tracking = Tracking(enabled=False), params: dict | None = None, **options) -> RunsDone:
    """Generate `tasks` with `program` into `out` (or `repeats` files, OUT.r1.jsonl, …),
    one MLflow run per file; `options` go to `clbench.generation.run`."""
    outs = [(Path(out), None)] if repeats == 1 else [(generation.repeat_path(out, i), i) for i in range(1, repeats + 1)]
    done = RunsDone()
    for path, repeat in outs:
        logged = {**(params or {}), "out": str(path), "repeat": repeat}
        with tracked(tracking, f"run-{path.stem}", "run", logged) as run_:
            with run_.traced(tracking.trace):
                result = generation.run(program, tasks, path, lm=lm, method=method, repeat=repeat, **options)
            if run_.traces is not None:
                result.summary["traces"] = run_.traced_counts()
            if run_.active:
                from cg_dspy import tracking as mlflow_tracking

                mlflow_tracking.log_run_summary(result.summary)
                if result.outcome.interrupted:
                    run_.stopped_early()
        done.results[str(path)] = result
        done.warnings += run_.warnings
        if result.outcome.interrupted:
            break
    return done


@dataclass
class Evaluated:
    """What `evaluate` did: the grading, the report of the graded file, lost traces."""

    graded: GradeResult
    report: Report
    warnings: list[str]


def evaluate(rows, out: str | os.PathLike, *, judge_lm, tracking: Tracking = Tracking(enabled=False),
             name: str | None = None, params: dict | None = None, **options) -> Evaluated:
    """Grade result rows into `out` (`options` go to `clbench.grading.grade_file`), one
    MLflow run with the report's metrics and the verdicts on the tasks' traces."""
    label = Path(out).name
    with tracked(tracking, name or f"eval-{label}", "eval", params or {}) as run_:
        with run_.traced(tracking.trace):
            graded = grading.grade_file(rows, str(out), judge_lm=judge_lm, **options)
        report = analysis.report({label: graded.rows})
        if run_.active:
            from cg_dspy import tracking as mlflow_tracking

            mlflow_tracking.log_report(report, per_run=False)
            mlflow_tracking.log_metrics(run_.traced_counts(), prefix="traces.")
            mlflow_tracking.log_endpoints(graded.endpoints)
            mlflow_tracking.log_text(markdown.to_markdown(report), "report.md")
            if graded.outcome.interrupted:
                run_.stopped_early()
    return Evaluated(graded, report, run_.warnings)


def compare(experiment: str, *, stages: list[str] | None = None, a: int | None = None, b: int | None = None,
            uri: str | None = None) -> dict:
    """Prompt versions from the Prompt Registry side by side, and the runs (read only)."""
    from cg_dspy import tracking
    from cg_dspy.reports.prompt_diffs import compare as diffs
    from cg_dspy.tracking.prompts import stage_versions
    from cg_dspy.tracking.runs import run_tables

    tracking.setup(uri, experiment, create=False)
    return diffs(stage_versions(stages), run_tables(experiment), a=a, b=b)
