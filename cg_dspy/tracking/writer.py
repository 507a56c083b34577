"""The trace writer process (`python -c "from cg_dspy.tracking.writer import main; main()"
RUN EXPERIMENT URI`), at the lowest CPU priority.

Tasks arrive as JSON lines on stdin; whatever has arrived is written in one go: all
their spans in one transaction, which makes the traces, then one link of them to the
run. (Going through the live tracer instead costs thirteen times as much CPU: a
transaction per span and one per trace.) Graded tasks' verdicts go on their traces as
assessments. After each batch it says on stdout what it stored ("stored N", "graded
N") or lost and why ("lost N why"), so the run reports exactly that; a batch the store
refuses (a locked database) is tried again before it counts as lost.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import secrets
import signal
import sys
import threading
import time

from cg_dspy.core.observe import trace_reference
from cg_dspy.judge.verdicts import Verdict
from cg_dspy.tracking.assessments import replace_verdicts
from cg_dspy.tracking.traces import TASK_TAG, trace_ids

WRITE_BATCH = 64  # traces per store transaction, at most
WRITE_ATTEMPTS = 3  # a batch the store refuses is tried again after 1 s, then 4 s
TRACE_ID = "tr-{:032x}"


def main() -> None:
    run_id, experiment_id, uri = sys.argv[1:4]
    os.nice(19)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run decides when the writer stops
    import mlflow
    from mlflow import MlflowClient
    from mlflow.tracing.client import TracingClient

    mlflow.set_tracking_uri(uri)
    client, runs = TracingClient(uri), MlflowClient(uri)
    runs.get_run(run_id)  # the store answers before the run starts
    acks = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write the acknowledgements' channel

    def say(*words) -> None:
        acks.write(" ".join(str(w).replace("\n", " ") for w in words) + "\n")
        acks.flush()

    say("ready")
    lines: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [lines.put(x) for x in sys.stdin] + [lines.put(None)], daemon=True).start()
    found = _TraceFinder(run_id)
    done = False
    while not done:
        batch = [lines.get()]
        while batch[-1] is not None and len(batch) < WRITE_BATCH and not lines.empty():
            batch.append(lines.get())
        done = batch[-1] is None
        messages = [json.loads(line) for line in filter(None, batch)]
        traces = [_stored_trace(m["trace"]) for m in messages if "trace" in m]
        new = []
        if traces:
            spans = [span for _, _, trace_spans in traces for span in trace_spans]
            error = _attempt(lambda s=spans: client.log_spans(experiment_id, s))
            if error:
                say("lost", len(traces), f"the store refused {len(traces)} trace(s): {error}")
            else:
                found.known.update({task: trace for trace, task, _ in traces if task is not None})
                new += [trace for trace, _, _ in traces]
                say("stored", len(traces))
        for message in messages:  # traces of another run (`run`'s, graded by `eval`) are linked too
            if "graded" in message:
                trace_id = found(message["graded"])
                if trace_id is None:
                    say("ungraded", 1, "the graded task's trace is not in this store")
                    continue
                verdicts = [Verdict.from_json(v) for v in message["graded"]["verdicts"]]
                error = _attempt(lambda t=trace_id, v=verdicts, j=message["judge"]: replace_verdicts(t, v, j))
                if error:
                    say("ungraded", 1, f"verdicts not stored: {error}")
                else:
                    new.append(trace_id)
                    say("graded", 1)
        new = list(dict.fromkeys(new))
        for i in range(0, len(new), 100):  # the store links at most 100 per call
            _attempt(lambda chunk=new[i:i + 100]: runs.link_traces_to_run(chunk, run_id))
    sys.stderr.flush()
    os._exit(0)  # all is committed: skip the interpreter's teardown (MLflow's exit hooks take ~0.3 s)


def _attempt(write) -> str | None:
    """Run `write`, again after 1 s and 4 s if the store refuses it; the last error's
    first line, or None when it went through."""
    last = ""
    for attempt in range(WRITE_ATTEMPTS):
        try:
            write()
            return None
        except Exception as error:  # a store that fails loses these writes, never the run
            first = (str(error).strip().splitlines() or [""])[0][:300]
            last = f"{type(error).__name__}: {first}"
            if attempt + 1 < WRITE_ATTEMPTS:
                time.sleep(4 ** attempt)
    return last


class _TraceFinder:
    """Trace id of a graded task from its trace reference: a trace id, or the run whose
    traces hold it (this writer's own, or looked up once per run)."""

    def __init__(self, run_id: str):
        self.known: dict[str, str] = {}
        self.by_run: dict[str, dict[str, str]] = {run_id: self.known}

    def __call__(self, graded: dict) -> str | None:
        from mlflow.exceptions import MlflowException

        ref = trace_reference(graded.get("trace")) or {}
        if "trace_id" in ref:
            return ref["trace_id"]
        run = ref.get("run_id")
        if run is None:
            return None
        if run not in self.by_run:
            try:
                self.by_run[run] = trace_ids(run)
            except MlflowException:
                self.by_run[run] = {}  # a run of another store
        return self.by_run[run].get(str(graded.get("task_id")))


def _stored_trace(node: dict) -> tuple[str, str | None, list]:
    """A recorded task as MLflow spans, the root carrying the task id as a trace tag:
    (trace id, task id, spans). MLflow's store makes the trace from its spans."""
    from mlflow.entities import Span

    otel_trace = secrets.randbits(128)
    trace_id = TRACE_ID.format(otel_trace)
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
        if not node["children"] and "prompt_tokens" in node["attributes"]:  # a stage: its LM tokens
            attributes["mlflow.chat.tokenUsage"] = token_usage(node["attributes"])
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


def token_usage(attributes: dict) -> dict[str, int]:
    """A stage's tokens as MLflow's token-usage attribute: the store adds the stages up
    into the trace's usage, which the trace table's Tokens column shows."""
    prompt, completion = int(attributes.get("prompt_tokens") or 0), int(attributes.get("completion_tokens") or 0)
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
