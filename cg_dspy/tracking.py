"""Every MLflow call of the project, and nothing else.

Runs go to a named experiment in an embedded SQLite store (`sqlite:///mlflow.db` in
the working directory) unless `--tracking-uri` or `MLFLOW_TRACKING_URI` says
otherwise. Params never hold a key: values of secret-looking environment variables
and secret-looking names are redacted before anything is logged.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from cg_dspy.redact import redact

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "contextguard"
PROGRAM_ARTIFACT = "program.json"  # a run's compiled program, as JSON state
KIND_TAG = "cg_dspy.kind"


def _mlflow():
    import mlflow

    return mlflow


def setup(tracking_uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT, *, create: bool = True) -> str:
    """Point MLflow at the store and experiment; returns the tracking URI used. With
    `create=False` (commands that only read) a local store must already exist."""
    mlflow = _mlflow()
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if not create:
        local = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else \
            uri.removeprefix("file://") if uri.startswith("file://") else None
        if local is not None and not Path(local).exists():
            raise FileNotFoundError(f"no MLflow store at {uri} (pass --tracking-uri or set MLFLOW_TRACKING_URI)")
    mlflow.set_tracking_uri(uri)
    if create:
        mlflow.set_experiment(experiment)
    return uri


def _flatten(params: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for k, v in params.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, f"{name}."))
        else:
            out[name] = v if isinstance(v, (int, float, bool)) else json.dumps(v) if not isinstance(v, str) else v
    return out


@contextmanager
def run(name: str, *, kind: str, params: dict):
    """An MLflow run of `kind` (optimize, bench, eval) with redacted params."""
    mlflow = _mlflow()
    with mlflow.start_run(run_name=name) as active:
        mlflow.set_tag(KIND_TAG, kind)
        mlflow.log_params({k: str(v)[:6000] for k, v in _flatten(redact(params)).items()})
        yield active


def _metric_name(text: str) -> str:
    return re.sub(r"[^\w\-. /]", "_", text)


def log_metrics(metrics: dict[str, float | None], prefix: str = "") -> None:
    _mlflow().log_metrics({_metric_name(f"{prefix}{k}"): float(v) for k, v in metrics.items() if v is not None})


def log_summary(summary: dict, prefix: str) -> None:
    """TSR, rubric pass rate and per-category TSR of one analysis.run_summary."""
    metrics = {"task_solving_rate": summary["task_solving_rate"]}
    if "rubric_pass_rate" in summary:
        metrics["rubric_pass_rate"] = summary["rubric_pass_rate"]
    for cat, cell in summary.get("by_category", {}).items():
        metrics[f"tsr.{cat}"] = cell["task_solving_rate"]
    log_metrics(metrics, prefix)


def log_report(report: dict, *, per_run: bool) -> None:
    """Each run's summary and generation cost of an analysis.report; `per_run` prefixes
    the metric names with the run's name (several runs in one MLflow run)."""
    for name, summary in report["runs"].items():
        prefix = f"{name}." if per_run else ""
        log_summary(summary, prefix)
        if (report.get("cost") or {}).get(name):
            log_metrics(report["cost"][name], prefix=f"{prefix}cost.")


def log_text(text: str, artifact_file: str) -> None:
    _mlflow().log_text(redact(text), artifact_file)


def log_artifacts(directory: str | Path, artifact_path: str) -> None:
    _mlflow().log_artifacts(str(directory), artifact_path)


def prompts_of(program) -> dict[str, dict]:
    """Each predictor's instruction and demos, as the compare command reads them."""
    out = {}
    for name, predictor in program.named_predictors():
        demos = [{k: v for k, v in dict(d).items() if k != "conversation"} for d in predictor.demos]
        out[name] = {"instructions": predictor.signature.instructions, "demos": demos}
    return out


def log_program(program, *, log_model: bool = True) -> None:
    """The compiled program as JSON state, readable prompts, and an MLflow DSPy model."""
    mlflow = _mlflow()
    state = program.dump_state()
    mlflow.log_dict(redact(state), PROGRAM_ARTIFACT)
    prompts = prompts_of(program)
    mlflow.log_dict(redact(prompts), "prompts/prompts.json")
    for name, p in prompts.items():
        demos = "\n\n".join(json.dumps(d, ensure_ascii=False, default=str, indent=1) for d in p["demos"])
        log_text(f"# {name}\n\n{p['instructions']}\n\n## demos ({len(p['demos'])})\n\n{demos}\n", f"prompts/{name}.md")
    if log_model:
        import mlflow.dspy

        mlflow.dspy.log_model(program, name="model", use_dspy_model_save=True)
        # log_model makes the new model "active", which would tie later runs' metrics to it.
        mlflow.clear_active_model()


@contextmanager
def autolog():
    """Traces of compile and evaluation calls (DSPy autologging), for one block only."""
    import mlflow.dspy

    mlflow.dspy.autolog(log_compiles=True, log_evals=True, log_traces_from_compile=False, silent=True)
    try:
        yield
    finally:
        mlflow.dspy.autolog(disable=True, silent=True)


def _run_artifact_uri(uri: str, artifact: str) -> str:
    if uri.startswith("runs:/") and uri.rstrip("/").count("/") == 1:
        return uri.rstrip("/") + "/" + artifact
    return uri


def load_program_state(uri: str) -> dict | None:
    """The JSON state logged with a run (`runs:/ID` or `runs:/ID/program.json`), or None."""
    mlflow = _mlflow()
    target = _run_artifact_uri(uri, PROGRAM_ARTIFACT)
    if not target.endswith(".json"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = mlflow.artifacts.download_artifacts(artifact_uri=target, dst_path=tmp)
        except Exception as exc:  # noqa: BLE001 - MLflow raises several kinds for a missing artifact
            if uri.startswith("runs:/"):
                run_id = uri.split("/")[1]
                try:
                    mlflow.get_run(run_id)
                except Exception:  # noqa: BLE001
                    raise ValueError(f"{uri}: no such run in the MLflow store {mlflow.get_tracking_uri()} "
                                     "(pass --tracking-uri or set MLFLOW_TRACKING_URI)") from exc
            return None
        return json.loads(Path(path).read_text(encoding="utf-8"))


def compare(experiment: str, run_ids: list[str] | None = None) -> dict:
    """Runs side by side (params and metrics) and a diff of each predictor's instruction
    between the first two runs that logged prompts. Reads only MLflow data."""
    mlflow = _mlflow()
    found = mlflow.search_runs(experiment_names=[experiment], output_format="list", order_by=["start_time ASC"])
    if run_ids:
        found = [r for r in found if r.info.run_id in set(run_ids) or r.info.run_id[:8] in set(run_ids)]
    else:  # the project's own runs, not the nested ones autologging adds
        found = [r for r in found if KIND_TAG in r.data.tags]
    rows, prompts = [], {}
    for r in found:
        rows.append({"run_id": r.info.run_id, "name": r.info.run_name, "kind": r.data.tags.get(KIND_TAG, ""),
                     "params": dict(r.data.params), "metrics": dict(r.data.metrics)})
        with tempfile.TemporaryDirectory() as tmp:
            try:
                path = mlflow.artifacts.download_artifacts(run_id=r.info.run_id,
                                                           artifact_path="prompts/prompts.json", dst_path=tmp)
                prompts[r.info.run_id] = json.loads(Path(path).read_text(encoding="utf-8"))
            except Exception:  # noqa: BLE001 - a run without prompts
                continue
    diffs = {}
    with_prompts = [r["run_id"] for r in rows if r["run_id"] in prompts]
    if len(with_prompts) >= 2:
        a, b = (prompts[i] for i in with_prompts[:2])
        for name in sorted(set(a) | set(b)):
            before = (a.get(name) or {}).get("instructions", "").splitlines()
            after = (b.get(name) or {}).get("instructions", "").splitlines()
            diffs[name] = "\n".join(difflib.unified_diff(before, after, with_prompts[0][:8], with_prompts[1][:8],
                                                         lineterm=""))
    return {"runs": rows, "instruction_diff": diffs, "diffed": with_prompts[:2]}
