"""MLflow runs of the commands (`run`, `eval`, `bench`, `optimize`): params with real
values (keys redacted by value and by name, see redact.py), metrics, reports, and how
each run ended: FINISHED, FAILED, or KILLED when it was stopped early."""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from pathlib import Path

from cg_dspy.core.redact import redact
from cg_dspy.tracking.store import KIND_TAG, mlflow

RUN_COLUMNS = {  # what `compare` shows of each kind of run
    "optimize": ["params.optimizer", "params.budget", "dev_before.task_solving_rate", "dev.task_solving_rate",
                 "dev_before.rubric_pass_rate", "dev.rubric_pass_rate"],
    "eval": ["params.protocol", "params.votes", "task_solving_rate"],
    "run": ["params.method", "finished", "failed", "lm_calls"],
}


class Run:
    """The active run of a command: its `info` (MLflow's), and the status it ends with."""

    def __init__(self, active):
        self.info = active.info
        self.status = "FINISHED"

    def stopped_early(self) -> None:
        """The command was interrupted: the run ends KILLED, not FINISHED."""
        self.status = "KILLED"


def _flatten(params: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for k, v in params.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{name}."))
        else:
            out[name] = v if isinstance(v, (int, float, bool, str)) or v is None else json.dumps(v)
    return out


@contextmanager
def run(name: str, *, kind: str, params: dict):
    """An MLflow run of `kind` with redacted params. It ends FINISHED, KILLED (stopped
    early, or interrupted by Ctrl-C / SIGTERM) or FAILED (an error), never RUNNING."""
    active = mlflow().start_run(run_name=name)
    handle, status = Run(active), "FAILED"
    try:
        mlflow().set_tag(KIND_TAG, kind)
        mlflow().log_params({k: str(v)[:6000] for k, v in _flatten(redact(params)).items()})
        yield handle
        status = handle.status
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        mlflow().end_run(status)


def _metric_name(text: str) -> str:
    return re.sub(r"[^\w\-. /]", "_", text)


def log_metrics(metrics: dict[str, float | None], prefix: str = "", step: int | None = None) -> None:
    mlflow().log_metrics({_metric_name(f"{prefix}{k}"): float(v) for k, v in metrics.items()
                          if isinstance(v, (int, float)) and not isinstance(v, bool)}, step=step)


def _with_interval(name: str, value, ci) -> dict:
    """A rate and its 95% interval as three metrics (MLflow metrics are single numbers)."""
    out = {name: value}
    if ci:
        out.update({f"{name}.ci95_lo": ci[0], f"{name}.ci95_hi": ci[1]})
    return out


def log_step(run_id: str, key: str, value: float, step: int) -> None:
    """One step of a metric of a given run, from any thread (optimizers report candidates
    from their worker threads, where no run is active)."""
    from mlflow import MlflowClient

    MlflowClient().log_metric(run_id, _metric_name(key), float(value), step=step)


def log_summary(summary: dict, prefix: str = "") -> None:
    """TSR and rubric pass rate with their 95% intervals, and per-category TSR, of one
    analysis.run_summary (or optimize's dev scores)."""
    metrics = _with_interval("task_solving_rate", summary["task_solving_rate"],
                             summary.get("task_solving_rate_ci95"))
    if "rubric_pass_rate" in summary:
        metrics.update(_with_interval("rubric_pass_rate", summary["rubric_pass_rate"],
                                      summary.get("rubric_pass_rate_ci95")))
    for cat, cell in summary.get("by_category", {}).items():
        metrics.update(_with_interval(f"tsr.{cat}", cell["task_solving_rate"], cell.get("task_solving_rate_ci95")))
    log_metrics(metrics, prefix)


def log_comparison(comparison: dict, prefix: str = "") -> None:
    """A paired comparison: the difference of TSR with its interval, McNemar's p, the
    discordant counts, and the rubric pass rate's difference with its interval."""
    metrics = {**_with_interval("delta_task_solving_rate", comparison["delta_task_solving_rate"],
                                comparison.get("delta_task_solving_rate_ci95")),
               "mcnemar_p": comparison.get("mcnemar_p"), "newly_solved": comparison.get("newly_solved"),
               "broken_solved": comparison.get("broken_solved")}
    if comparison.get("delta_rubric_pass_rate") is not None:
        metrics.update(_with_interval("delta_rubric_pass_rate", comparison["delta_rubric_pass_rate"],
                                      comparison.get("delta_rubric_pass_rate_ci95")))
    log_metrics(metrics, prefix)


def log_report(report, *, per_run: bool) -> None:
    """Each run's summary (with intervals) and generation cost of a `reports.Report`, its
    paired comparisons and repeats; `per_run` prefixes the metric names with the run's
    name (several runs in one MLflow run)."""
    for name, summary in report.runs.items():
        prefix = f"{name}." if per_run else ""
        log_summary(summary.to_dict(), prefix)
        if report.cost.get(name):
            log_metrics(report.cost[name], prefix=f"{prefix}cost.")
    for comparison in report.comparisons:
        log_comparison(comparison.to_dict(), prefix=f"{comparison.before} vs {comparison.after}.")
    for name, repeats in report.repeats.items():
        mean, std = repeats.mean_std
        log_metrics({"mean": mean, "std": std, "runs": repeats.runs}, prefix=f"repeats.{name}.task_solving_rate.")


def log_run_summary(summary: dict) -> None:
    """A generation run's summary: tasks, paths taken, calls, tokens, traces stored."""
    log_metrics({k: v for k, v in summary.items() if not isinstance(v, dict)})
    log_metrics(summary.get("paths") or {}, prefix="paths.")
    log_metrics(summary.get("traces") or {}, prefix="traces.")
    log_endpoints(summary.get("endpoints"))


def log_endpoints(stats: dict | None) -> None:
    """Per replica (numbered in the order --api-base gave them, each one's URL a tag):
    tasks, calls, failures and seconds."""
    for i, (base, counts) in enumerate((stats or {}).items()):
        mlflow().set_tag(f"endpoint.{i}", base)
        log_metrics(counts, prefix=f"endpoint.{i}.")


def log_text(text: str, artifact_file: str) -> None:
    mlflow().log_text(redact(text), artifact_file)


def log_dict(value: dict, artifact_file: str) -> None:
    mlflow().log_dict(redact(value), artifact_file)


def log_artifacts(directory: str | Path, artifact_path: str) -> None:
    mlflow().log_artifacts(str(directory), artifact_path)


@contextmanager
def autolog():
    """DSPy's own traces of the program calls an optimizer makes, scored by the metric
    (as an assessment named after it); no program-state params, which would go stale."""
    import mlflow.dspy

    mlflow.dspy.autolog(log_traces=True, log_traces_from_compile=True, log_traces_from_eval=True,
                        log_compiles=False, log_evals=False, silent=True)
    try:
        yield
    finally:
        mlflow.dspy.autolog(disable=True, silent=True)


def run_tables(experiment: str) -> dict[str, list[dict]]:
    """A compact table per kind of run of the experiment (the columns of RUN_COLUMNS)."""
    runs = mlflow().search_runs(experiment_names=[experiment], output_format="list", order_by=["start_time ASC"])
    tables: dict[str, list[dict]] = {}
    for r in runs:
        kind = r.data.tags.get(KIND_TAG)
        if kind is None:
            continue
        cells = {"run_id": r.info.run_id[:8], "name": r.info.run_name}
        for column in RUN_COLUMNS.get(kind, ["task_solving_rate"]):
            key = column.removeprefix("params.")
            cells[key] = r.data.params.get(key) if column.startswith("params.") else r.data.metrics.get(column)
        tables.setdefault(kind, []).append(cells)
    return tables
