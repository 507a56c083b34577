"""Every MLflow call of the project, and nothing else.

Runs go to a named experiment in an embedded SQLite store (`sqlite:///mlflow.db` in
the working directory) unless `--tracking-uri` or `MLFLOW_TRACKING_URI` says
otherwise. What lands there:

- runs (`run`, `eval`, `bench`, `optimize`), their params with real values (keys are
  redacted by value and by name, see redact.py), metrics, reports and programs;
- a trace per task, its spans named by stage (`draft`, `audit`, `format_check`, …,
  `revise`, `guard`) with calls, tokens, cache hits, the path and the guard's reasons;
  `eval` attaches each requirement's majority verdict to the task's trace;
- the Prompt Registry: one prompt per stage (`contextguard.audit`, `contextguard.revise`,
  …), its untuned instruction the first version and each optimize run's tuned
  instruction a new one, demos beside it (a run artifact the version's tags point to);
- one logged model per optimize run (`mlflow.dspy`, with a signature, an input example
  and its prompt versions); it calls the LM its loader's environment names.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cg_dspy.method.stages import observing
from cg_dspy.redact import redact

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "contextguard"
PROGRAM_ARTIFACT = "program.json"  # a run's compiled program, as JSON state
KIND_TAG = "cg_dspy.kind"
PROMPT_PREFIX = "contextguard"  # registered prompts are contextguard.<stage>
MODEL_NAME = "model"


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


# --- runs: params, metrics, artifacts --------------------------------------------------


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
    """An MLflow run of `kind` (run, eval, bench, optimize) with redacted params."""
    mlflow = _mlflow()
    with mlflow.start_run(run_name=name) as active:
        mlflow.set_tag(KIND_TAG, kind)
        mlflow.log_params({k: str(v)[:6000] for k, v in _flatten(redact(params)).items()})
        yield active


def _metric_name(text: str) -> str:
    return re.sub(r"[^\w\-. /]", "_", text)


def log_metrics(metrics: dict[str, float | None], prefix: str = "") -> None:
    _mlflow().log_metrics({_metric_name(f"{prefix}{k}"): float(v) for k, v in metrics.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool)})


def log_summary(summary: dict, prefix: str = "") -> None:
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


def log_run_summary(summary: dict) -> None:
    """A generation run's summary: tasks, paths taken, calls and tokens."""
    log_metrics({k: v for k, v in summary.items() if not isinstance(v, dict)})
    log_metrics(summary.get("paths") or {}, prefix="paths.")


def log_text(text: str, artifact_file: str) -> None:
    _mlflow().log_text(redact(text), artifact_file)


def log_artifacts(directory: str | Path, artifact_path: str) -> None:
    _mlflow().log_artifacts(str(directory), artifact_path)


def log_split(name: str, tasks, source: str) -> None:
    """A split as a run input (MLflow dataset): one row per task, with a digest."""
    import pandas as pd

    mlflow = _mlflow()
    frame = pd.DataFrame([{"task_id": t.idx, "context_id": t.metadata.context_id, "category": t.category,
                           "sub_category": t.metadata.sub_category, "rubrics": len(t.rubrics)} for t in tasks])
    digest = hashlib.sha256(frame.to_json().encode()).hexdigest()[:16]
    mlflow.log_input(mlflow.data.from_pandas(frame, source=source, name=f"{name} ({source})", digest=digest),
                     context=name)


# --- traces: a span per task and per stage, verdicts as assessments ----------------------
#
# MLflow builds a span in ~0.2 ms of CPU and its SQLite store takes ~28 ms of CPU to write
# one trace, both under the GIL of the process that makes them. So the stages' spans are
# recorded in memory (a few microseconds each) and a whole task is handed to a trace
# writer: a separate, low-priority process that builds the MLflow trace with the recorded
# times and writes it, on a core the run does not need. Leaving `tracing()` waits until
# every trace is written. A trace carries the task id as a tag and is linked to its run
# (and to the eval run that grades it), which is how `eval` finds it again.

TASK_TAG = "cg_dspy.task_id"
_RUN_ID = re.compile(r"[0-9a-f]{32}")
_TRACE_ID = re.compile(r"tr-[0-9a-f]{32}")


class _Span:
    """A live MLflow span as the method's stages see it (the inline tracer)."""

    def __init__(self, live):
        self.live = live
        self.trace_ref = {"trace_id": live.trace_id}

    def set(self, outputs: dict | None = None, **attributes) -> None:
        if outputs is not None:
            self.live.set_outputs(outputs)
        self.live.set_attributes({k: v for k, v in attributes.items() if v is not None})


@contextmanager
def _open_span(name: str, attributes: dict) -> Iterator[_Span]:
    with _mlflow().start_span(name=name) as live:
        if attributes:
            live.set_inputs(attributes)
        yield _Span(live)


class _Recorded:
    """A span held in memory until its task is done."""

    def __init__(self, node: dict, run_id: str):
        self.node = node
        self.trace_ref = {"run_id": run_id}

    def set(self, outputs: dict | None = None, **attributes) -> None:
        if outputs is not None:
            self.node["outputs"] = outputs
        self.node["attributes"].update({k: v for k, v in attributes.items() if v is not None})


class TraceWriter:
    """Records each task's spans; a writer process turns them into MLflow traces.

    Workers hand a finished task to a queue and go on; one thread sends it on as a JSON
    line. The writer is a plain `python -c` process (no multiprocessing: nothing of the
    caller's `__main__` is imported again), started and ready before the first task. If
    it cannot start or dies, the run goes on untraced and says so once."""

    def __init__(self, run_id: str, experiment_id: str, uri: str):
        import queue
        import subprocess
        import sys

        self.run_id = run_id
        self.failed: str | None = None
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from cg_dspy.tracking import write_traces; write_traces()",
             run_id, experiment_id, uri], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if not any(line.strip() == "ready" for line in self._process.stdout):  # EOF first: it failed
            self._process.wait()
            self._fail(f"the trace writer did not start (exit {self._process.returncode})")
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._local = threading.local()
        self._sender = threading.Thread(target=self._send, name="cg_dspy-traces", daemon=True)
        self._sender.start()

    def _fail(self, why: str) -> None:
        if self.failed is None:
            import logging

            self.failed = why
            logging.getLogger(__name__).warning("%s; the rest of this run is not traced", why)

    def _send(self) -> None:
        while (message := self._queue.get()) is not None:
            if self.failed:
                continue
            try:
                self._process.stdin.write(json.dumps(message, default=str) + "\n")
            except OSError as error:
                self._fail(f"the trace writer stopped ({error})")

    @contextmanager
    def span(self, name: str, attributes: dict) -> Iterator[_Recorded]:
        stack = self._local.__dict__.setdefault("stack", [])
        node = {"name": name, "inputs": attributes or None, "attributes": {}, "outputs": None, "children": [],
                "start": time.time_ns()}
        stack.append(node)
        try:
            yield _Recorded(node, self.run_id)
        except BaseException as error:
            node["error"] = f"{type(error).__name__}: {error}"[:500]
            raise
        finally:
            node["end"] = time.time_ns()
            stack.pop()
            if stack:
                stack[-1]["children"].append(node)
            else:
                self._queue.put({"trace": node})

    def annotate(self, graded: dict, judge: str) -> None:
        """A graded task's verdicts, for the writer to put on its trace."""
        self._queue.put({"verdicts": {k: graded.get(k) for k in _VERDICT_FIELDS}, "judge": judge})

    def close(self) -> None:
        """Wait until every trace is written."""
        self._queue.put(None)
        self._sender.join()
        try:
            self._process.stdin.close()
        except OSError:
            pass
        if self._process.wait() != 0 and not self.failed:
            self._fail(f"the trace writer failed (exit {self._process.returncode})")


WRITE_BATCH = 64  # traces per store transaction, at most


def write_traces() -> None:
    """The writer process (argv: run id, experiment id, tracking URI), lowest CPU
    priority: tasks arrive as JSON lines on stdin, and whatever has arrived is written in
    one go: all their spans in one transaction, which makes the traces, then one link of
    them to the run. Going through the live tracer instead costs thirteen times as much
    CPU: a transaction per span and one per trace."""
    import logging
    import queue
    import signal
    import sys

    run_id, experiment_id, uri = sys.argv[1:4]
    os.nice(19)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the run; its traces are still written
    from mlflow import MlflowClient
    from mlflow.tracing.client import TracingClient

    _mlflow().set_tracking_uri(uri)
    client, runs = TracingClient(uri), MlflowClient(uri)
    runs.get_run(run_id)  # the store answers before the run starts
    print("ready", flush=True)
    sys.stdout = sys.stderr  # nobody reads stdout from here on
    lines: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [lines.put(x) for x in sys.stdin] + [lines.put(None)], daemon=True).start()
    written: dict[str, str] = {}  # task id -> trace id, for the traces this writer wrote
    found = _TraceFinder(written, run_id)
    linked: set[str] = set()
    done = False
    while not done:
        batch = [lines.get()]
        while batch[-1] is not None and len(batch) < WRITE_BATCH and not lines.empty():
            batch.append(lines.get())
        done = batch[-1] is None
        messages = [json.loads(line) for line in filter(None, batch)]
        try:
            spans, new = [], []
            for message in messages:
                if "trace" in message:
                    trace_id, task, trace_spans = _stored_trace(message["trace"])
                    spans += trace_spans
                    new.append(trace_id)
                    if task is not None:
                        written[task] = trace_id
            if spans:
                client.log_spans(experiment_id, spans)  # creates the traces, tags and all
            for message in messages:  # traces of another run (`run`'s, graded by `eval`) are linked too
                if "verdicts" in message:
                    trace_id = _trace_of(message["verdicts"], found)
                    if trace_id and _log_row_verdicts(message["verdicts"], trace_id, message["judge"]):
                        new.append(trace_id)
            new = [t for t in dict.fromkeys(new) if t not in linked]
            for i in range(0, len(new), 100):  # the store links at most 100 per call
                runs.link_traces_to_run(new[i:i + 100], run_id)
            linked.update(new)
        except Exception as error:  # a store that fails loses these traces, never the run
            logging.getLogger(__name__).warning("could not write %d trace(s): %s", len(batch), error)
    sys.stderr.flush()
    os._exit(0)  # all is committed: skip the interpreter's teardown (MLflow's exit hooks take ~0.3 s)


_VERDICT_FIELDS = ("idx", "cg_dspy", "rubrics", "requirement_status", "votes", "grading_rationale", "error")


class _TraceFinder:
    """Trace id of a graded row's task from its trace reference: a trace id, or the run
    whose traces hold it (this writer's own, or looked up once per run)."""

    def __init__(self, known: dict[str, str] | None = None, run_id: str | None = None):
        self.by_run: dict[str, dict[str, str]] = {run_id: known} if run_id else {}

    def __call__(self, row: dict) -> str | None:
        from mlflow.exceptions import MlflowException

        ref = (row.get("cg_dspy") or {}).get("trace") or {}
        if _TRACE_ID.fullmatch(str(ref.get("trace_id"))):
            return ref["trace_id"]
        run = str(ref.get("run_id"))
        if not _RUN_ID.fullmatch(run):
            return None
        if run not in self.by_run:
            try:
                self.by_run[run] = trace_ids(run)
            except MlflowException:
                self.by_run[run] = {}  # a run of another store
        return self.by_run[run].get(str(row.get("idx")))


def _stored_trace(node: dict) -> tuple[str, str | None, list]:
    """A recorded task as MLflow spans, the root carrying the task id as a trace tag:
    (trace id, task id, spans). MLflow's store makes the trace from its spans."""
    import base64
    import secrets

    from mlflow.entities import Span

    otel_trace = secrets.randbits(128)
    trace_id = f"tr-{otel_trace:032x}"
    encoded = base64.b64encode(otel_trace.to_bytes(16, "big")).decode()
    task = (node["inputs"] or {}).get("task_id")
    spans = []

    def add(node: dict, parent: str | None) -> None:
        span_id = base64.b64encode(secrets.token_bytes(8)).decode()
        attributes = {"mlflow.traceRequestId": trace_id, "mlflow.spanType": "CHAIN", **node["attributes"]}
        if parent is None and task is not None:
            attributes[f"mlflow.traceTag.{TASK_TAG}"] = str(task)
        if node["inputs"] is not None:
            attributes["mlflow.spanInputs"] = node["inputs"]
        if node["outputs"] is not None:
            attributes["mlflow.spanOutputs"] = node["outputs"]
        spans.append(Span.from_dict({
            "trace_id": encoded, "span_id": span_id, "parent_span_id": parent, "name": node["name"],
            "start_time_unix_nano": node["start"], "end_time_unix_nano": node["end"], "events": [],
            "status": {"code": "STATUS_CODE_ERROR" if "error" in node else "STATUS_CODE_OK",
                       "message": node.get("error", "")},
            "attributes": {k: json.dumps(v, default=str) for k, v in attributes.items()}}))
        for child in node["children"]:
            add(child, span_id)

    add(node, None)
    return trace_id, None if task is None else str(task), spans


@contextmanager
def tracing(enabled: bool = True, *, inline: bool = False) -> Iterator[None]:
    """Trace every task and stage in this block (inside a run; a no-op when not
    `enabled`). `inline` makes real MLflow spans in this process, so they nest under
    DSPy's own (optimize); otherwise the trace writer does the work."""
    if not enabled:
        yield
        return
    if inline:
        with observing(_open_span):
            yield
        return
    mlflow = _mlflow()
    active = mlflow.active_run()
    writer = TraceWriter(active.info.run_id, active.info.experiment_id, mlflow.get_tracking_uri())
    if writer.failed:
        yield
        return
    try:
        with observing(writer.span, writer.annotate):
            yield
    finally:
        writer.close()


def trace_ids(run_id: str) -> dict[str, str]:
    """Task id -> trace id for the traces a run logged."""
    return {t.info.tags.get(TASK_TAG): t.info.trace_id for t in find_traces(run_id, spans=False)
            if t.info.tags.get(TASK_TAG)}


def log_verdicts(graded_rows: list[dict], *, judge: str) -> int:
    """Each requirement's majority verdict on its task's trace: one assessment per rubric,
    named R01, R02, … (value True for "yes"), with the votes and the judge's reason.
    Returns how many were logged; a trace the store does not hold is skipped. (Traced
    runs do this as they go, in the trace writer; this is for a graded file after the fact.)"""
    find = _TraceFinder()
    return sum(_log_row_verdicts(row, trace_id, judge) for row in graded_rows
               if (trace_id := _trace_of(row, find)))


def _trace_of(row: dict, find) -> str | None:
    """The trace a graded row's verdicts go on (none for a row whose grading failed)."""
    return None if row.get("error") else find(row)


def _log_row_verdicts(row: dict, trace_id: str, judge: str) -> int:
    from mlflow.entities import AssessmentSource
    from mlflow.exceptions import MlflowException

    source = AssessmentSource(source_type="LLM_JUDGE", source_id=judge)
    rubrics, votes = row.get("rubrics") or [], row.get("votes") or []
    reasons = _reasons(row.get("grading_rationale") or "", len(rubrics))
    logged = 0
    try:
        for i, (rubric, status) in enumerate(zip(rubrics, row.get("requirement_status") or [])):
            voted = votes[i] if i < len(votes) else []
            # The UI shows an assessment's rationale, not its metadata: say there what was checked.
            rationale = "\n\n".join(filter(None, [reasons[i], f"Requirement: {rubric[:2000]}",
                                                   f"Votes: {', '.join(voted)}" if voted else ""]))
            _mlflow().log_feedback(trace_id=trace_id, name=f"R{i + 1:02d}", value=status == "yes", source=source,
                                   rationale=rationale,
                                   metadata={"rubric": rubric[:2000],
                                             "votes": ",".join(voted)})
            logged += 1
    except MlflowException:
        pass  # the trace is not in this store (a results file from elsewhere)
    return logged


def _reasons(rationale: str, n: int) -> list[str]:
    """The judge's reason per requirement from a graded row's rationale."""
    found = dict(re.findall(r"^Requirement (\d+): \w+ \((.*)\)$", rationale, flags=re.MULTILINE))
    return [found.get(str(i + 1), "") for i in range(n)]


def find_traces(run_id: str, *, spans: bool = True) -> list:
    """The traces logged under a run (one per task)."""
    mlflow = _mlflow()
    experiment = mlflow.get_run(run_id).info.experiment_id
    return mlflow.search_traces(locations=[experiment], run_id=run_id, return_type="list", include_spans=spans)


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


# --- the Prompt Registry -------------------------------------------------------------------


def prompt_name(stage: str) -> str:
    return f"{PROMPT_PREFIX}.{stage}"


def prompts_of(program) -> dict[str, dict]:
    """Each predictor's instruction and demos (the conversation left out of demos)."""
    out = {}
    for name, predictor in program.named_predictors():
        demos = [{k: v for k, v in dict(d).items() if k != "conversation"} for d in predictor.demos]
        out[name] = {"instructions": predictor.signature.instructions, "demos": demos}
    return out


def _versions(name: str) -> list:
    """Every version of a registered prompt, oldest first ([] when it is not registered)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        versions = list(MlflowClient().search_prompt_versions(name))
    except MlflowException:
        return []
    return sorted(versions, key=lambda v: int(v.version))


def register_prompts(program, base, *, tuned: tuple[str, ...], run_id: str, message: str, tags: dict,
                     alias: str | None = None) -> dict[str, object]:
    """Every stage of `program` as a registered prompt: a stage seen for the first time
    gets `base`'s (untuned) instruction as its first version; each tuned stage gets this
    run's instruction as a new version, its demos logged beside it; every version used
    is linked to the run. Returns the versions, by stage."""
    from mlflow import MlflowClient

    mlflow, client = _mlflow(), MlflowClient()
    base_prompts, prompts = prompts_of(base), prompts_of(program)
    config = json.dumps(program.config())
    versions = {}
    for stage, prompt in prompts.items():
        name = prompt_name(stage)
        known = _versions(name)
        if not known:
            known = [mlflow.genai.register_prompt(
                name, base_prompts[stage]["instructions"], commit_message="untuned (the paper's prompt)",
                tags={"variant": "base", "demos": "0", "cg_dspy_config": config})]
        # An untuned stage links the version this run used (its instruction, no demos), not
        # whatever another run registered last.
        version = next((v for v in known if v.template == prompt["instructions"] and not prompt["demos"]
                        and (v.tags or {}).get("demos", "0") == "0"), None)
        if stage in tuned or version is None:
            demos_file = f"prompts/{stage}.demos.json"
            mlflow.log_dict(redact(prompt["demos"]), demos_file)
            demos = json.dumps(prompt["demos"], sort_keys=True, default=str)
            version = mlflow.genai.register_prompt(
                name, prompt["instructions"], commit_message=message,
                tags={**{k: str(v) for k, v in tags.items()}, "variant": "tuned", "run_id": run_id,
                      "demos": str(len(prompt["demos"])), "demos_uri": f"runs:/{run_id}/{demos_file}",
                      "demos_digest": hashlib.sha256(demos.encode()).hexdigest()[:16], "cg_dspy_config": config})
        if alias:  # on every stage, so the alias names one run's whole program
            mlflow.genai.set_prompt_alias(name, alias, int(version.version))
        client.link_prompt_version_to_run(run_id, version)
        versions[stage] = version
    return versions


def load_prompt_state(uri: str) -> dict:
    """A saved program's state from registered prompts: `prompts:/contextguard@ALIAS` (or
    `/VERSION`) takes each stage's version under that alias (a stage without one keeps
    its untuned instruction), its demos from the artifact its tags name."""
    mlflow = _mlflow()
    selector = uri.removeprefix("prompts:/")
    prefix, sep, which = selector.partition("@") if "@" in selector else selector.partition("/")
    if prefix != PROMPT_PREFIX or not which:
        raise ValueError(f"{uri}: write prompts:/{PROMPT_PREFIX}@ALIAS or prompts:/{PROMPT_PREFIX}/VERSION")
    state, config = {}, None
    for prompt in mlflow.genai.search_prompts(filter_string=f"name LIKE '{PROMPT_PREFIX}.%'"):
        stage = prompt.name.removeprefix(f"{PROMPT_PREFIX}.")
        try:
            version = mlflow.genai.load_prompt(f"prompts:/{prompt.name}{sep}{which}", link_to_model=False)
        except Exception:  # noqa: BLE001 - no version under that alias for this stage
            continue
        tags = version.tags or {}
        if tags.get("cg_dspy_config") and (config is None or tags.get("variant") == "tuned"):
            config = json.loads(tags["cg_dspy_config"])  # a tuned version's run decides the settings
        demos = _download_json(tags["demos_uri"]) if tags.get("demos_uri") else []
        state[stage] = {"signature": {"instructions": version.template}, "demos": demos}
    if not state:
        raise ValueError(f"{uri}: no registered {PROMPT_PREFIX}.* prompt has {which!r} in {mlflow.get_tracking_uri()}")
    return {**state, "cg_dspy": config} if config else state


def _download_json(uri: str):
    with tempfile.TemporaryDirectory() as tmp:
        path = _mlflow().artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp)
        return json.loads(Path(path).read_text(encoding="utf-8"))


# --- the compiled program: JSON state and one logged model -------------------------------


def log_program(program, *, prompts: dict | None = None, example: dict | None = None) -> None:
    """The compiled program as JSON state, and as one MLflow model (DSPy flavor) with a
    signature, an input example and its registered prompt versions. The model's LM is
    the loading process's (lms.EnvironmentLM): it holds no endpoint and no key."""
    import dspy
    import mlflow.dspy
    from mlflow.models import Model

    from cg_dspy.lms import ConversationAdapter
    from cg_dspy.lms.build import EnvironmentLM

    mlflow = _mlflow()
    mlflow.log_dict(redact(program.dump_state()), PROGRAM_ARTIFACT)
    mlflow.log_dict(redact(prompts_of(program)), "prompts/prompts.json")
    with dspy.context(lm=EnvironmentLM(), adapter=ConversationAdapter()):
        # mlflow.dspy's own saver, minus the check that runs the example through the LM
        # at logging time (it would call a model the logging process did not choose).
        flavor = types.SimpleNamespace(__name__=mlflow.dspy.__name__, save_model=_save_without_validation)
        Model.log(artifact_path=None, name=MODEL_NAME, flavor=flavor, model=program, input_example=example,
                  signature=model_signature(example) if example else None,
                  prompts=list((prompts or {}).values()) or None, use_dspy_model_save=True,
                  validate_serving_input=False)
    mlflow.clear_active_model()  # logging makes the model "active", which would tie later metrics to it


def model_signature(example: dict):
    """Inputs as the example has them; outputs the answer, how it came about, and the draft."""
    from mlflow.models import infer_signature

    return infer_signature(model_input=example, model_output={"answer": "…", "path": "revised", "draft": "…"})


def _save_without_validation(*, validate_serving_input=False, **kwargs):
    import mlflow.dspy

    return mlflow.dspy.save_model(**kwargs)


def _run_artifact_uri(uri: str, artifact: str) -> str:
    if uri.startswith("runs:/") and uri.rstrip("/").count("/") == 1:
        return uri.rstrip("/") + "/" + artifact
    return uri


def load_program_state(uri: str) -> dict | None:
    """The JSON state behind an MLflow URI: a run's `program.json` (`runs:/ID`), a logged
    model's run (`models:/...`), or registered prompts (`prompts:/contextguard@ALIAS`)."""
    mlflow = _mlflow()
    if uri.startswith("prompts:/"):
        return load_prompt_state(uri)
    if uri.startswith("models:/"):
        info = mlflow.models.get_model_info(uri)
        uri = f"runs:/{info.run_id}"
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


# --- compare: prompt versions side by side, compact run tables -----------------------------


RUN_COLUMNS = {
    "optimize": ["params.optimizer", "params.budget", "dev_before.task_solving_rate", "dev.task_solving_rate",
                 "dev_before.rubric_pass_rate", "dev.rubric_pass_rate"],
    "eval": ["params.protocol", "params.votes", "task_solving_rate"],
    "run": ["params.method", "finished", "failed", "lm_calls"],
}


def _version_row(version) -> dict:
    tags = version.tags or {}
    return {"version": int(version.version), "variant": tags.get("variant", ""), "run_id": tags.get("run_id", ""),
            "optimizer": tags.get("optimizer", ""), "dev_before": _number(tags.get("dev_before_tsr")),
            "dev_after": _number(tags.get("dev_tsr")), "demos": int(tags.get("demos", "0")),
            "message": version.commit_message or ""}


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _demos_text(version) -> list[str]:
    uri = (version.tags or {}).get("demos_uri")
    demos = _download_json(uri) if uri else []
    return json.dumps(demos, indent=1, ensure_ascii=False, sort_keys=True, default=str).splitlines()


def compare(experiment: str, *, stages: list[str] | None = None, a: int | None = None, b: int | None = None) -> dict:
    """The Prompt Registry's versions of each tuned stage with their dev scores, a unified
    diff of instructions and demos between two versions (default: the base and the best
    by dev task-solving rate), and a compact metric table per run kind."""
    mlflow = _mlflow()
    stages_out = {}
    for prompt in mlflow.genai.search_prompts(filter_string=f"name LIKE '{PROMPT_PREFIX}.%'"):
        stage = prompt.name.removeprefix(f"{PROMPT_PREFIX}.")
        versions = _versions(prompt.name)
        if (stages and stage not in stages) or (not stages and len(versions) < 2):
            continue
        rows = [_version_row(v) for v in versions]
        best = max(rows, key=lambda r: (r["dev_after"] if r["dev_after"] is not None else -1, r["version"]))
        va, vb = (a or rows[0]["version"]), (b or best["version"])
        pick = {int(v.version): v for v in versions}
        if va not in pick or vb not in pick:
            raise ValueError(f"{prompt.name}: versions are {sorted(pick)}; --a {va} / --b {vb} is not one of them")
        diff = difflib.unified_diff(pick[va].template.splitlines(), pick[vb].template.splitlines(), f"v{va}",
                                    f"v{vb}", lineterm="")
        demos = difflib.unified_diff(_demos_text(pick[va]), _demos_text(pick[vb]), f"v{va} demos", f"v{vb} demos",
                                     lineterm="")
        stages_out[stage] = {"versions": rows, "a": va, "b": vb, "instructions_diff": "\n".join(diff),
                             "demos_diff": "\n".join(demos)}
    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list", order_by=["start_time ASC"])
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
    return {"stages": stages_out, "runs": tables}
