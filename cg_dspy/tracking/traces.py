"""A trace per task, its spans named by stage (`draft`, `audit`, `format_check`, …,
`revise`, `guard`) with calls, tokens, cache hits, the path and the guard's reasons;
`eval` puts each requirement's verdict on the task's trace.

MLflow builds a span in ~0.2 ms of CPU and its SQLite store takes ~28 ms of CPU to write
one trace, both under the GIL of the process that makes them. So the stages' spans are
recorded in memory (a few microseconds each) and a whole task is handed to a trace
writer: a separate, low-priority process (`writer.py`) that builds the MLflow trace with
the recorded times and writes it, on a core the run does not need. The writer says
back how many traces and verdicts it stored, so a run knows exactly what was lost; it
is given up (and killed) when it makes no progress for `stall_seconds()`, so a stopped or
stuck writer never hangs a run. A trace carries the task id as a tag and is linked to
its run (and to the eval run that grades it), which is how `eval` finds it again.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cg_dspy.tracking.store import mlflow

TASK_TAG = "cg_dspy.task_id"
START_SECONDS = 120.0  # the writer imports MLflow and opens the store
STALL_SECONDS = 60.0  # after the run, a writer that stores nothing for this long is given up


def stall_seconds() -> float:
    """STALL_SECONDS, or `CG_TRACE_STALL_SECONDS` (a slow shared store may want longer)."""
    try:
        return float(os.environ.get("CG_TRACE_STALL_SECONDS") or STALL_SECONDS)
    except ValueError:
        return STALL_SECONDS

log = logging.getLogger(__name__)


@dataclass
class TraceReport:
    """What tracing did: traces and graded tasks handed to the writer, how many it stored,
    and why the rest were lost."""

    traced: bool = True
    sent: int = 0
    stored: int = 0
    verdicts_sent: int = 0
    verdicts_stored: int = 0
    problem: str | None = None

    @property
    def lost(self) -> int:
        return self.sent - self.stored

    def as_dict(self) -> dict:
        out = {"sent": self.sent, "stored": self.stored, "lost": self.lost}
        if self.verdicts_sent:
            out.update(graded_sent=self.verdicts_sent, graded_stored=self.verdicts_stored)
        return out

    def warning(self) -> str | None:
        """One line for the user when anything was lost, else None."""
        lost = [f"{self.lost} of {self.sent} traces"] if self.lost else []
        if self.verdicts_sent > self.verdicts_stored:
            lost.append(f"the verdicts of {self.verdicts_sent - self.verdicts_stored} of {self.verdicts_sent} "
                        "graded tasks")
        if not lost and self.traced:
            return None
        why = f" ({self.problem})" if self.problem else ""
        if not self.traced:
            return f"this run is not traced{why}"
        rows = "; their rows point to no trace" if self.lost else ""  # lost verdicts: the rows keep their trace
        return f"{' and '.join(lost)} were not stored in MLflow{why}{rows}"


class _Span:
    """A live MLflow span as the method's stages see it (the inline tracer)."""

    def __init__(self, live):
        self.live = live
        self.trace_ref = {"trace_id": live.trace_id}

    def set(self, outputs: object = None, **attributes) -> None:
        if outputs is not None:
            self.live.set_outputs(outputs)
        self.live.set_attributes({k: v for k, v in attributes.items() if v is not None})


class _Inline:
    """Real MLflow spans in this process, nested under DSPy's own (optimize's tracing)."""

    @contextmanager
    def span(self, name: str, attributes: dict) -> Iterator[_Span]:
        with mlflow().start_span(name=name) as live:
            if attributes:
                live.set_inputs(attributes)
            yield _Span(live)

    def graded(self, task) -> None:
        pass  # optimize grades through its metric, which autolog already records


class _Recorded:
    """A span held in memory until its task is done."""

    def __init__(self, node: dict, run_id: str):
        self.node = node
        self.trace_ref = {"run_id": run_id}

    def set(self, outputs: object = None, **attributes) -> None:
        if outputs is not None:
            self.node["outputs"] = outputs
        self.node["attributes"].update({k: v for k, v in attributes.items() if v is not None})


class TraceWriter:
    """Records each task's spans; a writer process turns them into MLflow traces.

    Workers hand a finished task to a queue and go on; one thread sends it on as a JSON
    line, another reads the writer's acknowledgements ("stored N", "lost N why",
    "graded N", "ungraded N why"). The writer is a plain `python -c` process in its own
    session (no multiprocessing: nothing of the caller's `__main__` is imported again;
    Ctrl-C reaches the run, not the writer), ready before the first task."""

    def __init__(self, run_id: str, experiment_id: str, uri: str):
        self.run_id = run_id
        self.report = TraceReport()
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._progress = time.monotonic()
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from cg_dspy.tracking.writer import main; main()", run_id, experiment_id, uri],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="cg_dspy-trace-acks", daemon=True)
        self._reader.start()
        try:
            ready = self._ready.wait(START_SECONDS) and self._process.poll() is None
        except BaseException:
            self._kill("interrupted while the trace writer started")
            raise
        if not ready:
            self._kill(self.report.problem or f"the trace writer did not start within {START_SECONDS:g} s")
            self.report.traced = False
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._local = threading.local()
        self._sender = threading.Thread(target=self._send, name="cg_dspy-traces", daemon=True)
        self._sender.start()

    @property
    def failed(self) -> bool:
        return not self.report.traced

    def _read(self) -> None:
        for line in self._process.stdout:
            word, _, rest = line.strip().partition(" ")
            count, _, why = rest.partition(" ")
            count = int(count) if count.isdigit() else 0
            with self._lock:
                self._progress = time.monotonic()
                if word == "ready":
                    self._ready.set()
                elif word == "stored":
                    self.report.stored += count
                elif word == "graded":
                    self.report.verdicts_stored += count
                elif word in ("lost", "ungraded", "failed"):
                    self.report.problem = self.report.problem or why or word
        self._ready.set()  # it ended: startup failed, or all is written

    def _send(self) -> None:
        while (message := self._queue.get()) is not None:
            if self._process.poll() is not None:
                continue
            try:
                self._process.stdin.write(json.dumps(message, default=str) + "\n")
                self._process.stdin.flush()
            except (OSError, ValueError) as error:
                self.report.problem = self.report.problem or f"the trace writer stopped ({error})"

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
            elif self.report.traced:
                with self._lock:
                    self.report.sent += 1
                self._queue.put({"trace": node})

    def graded(self, task) -> None:
        """A graded task's typed verdicts, for its trace."""
        if not self.report.traced:
            return
        with self._lock:
            self.report.verdicts_sent += 1
        self._queue.put({"graded": {"task_id": task.task_id, "trace": task.trace_ref,
                                    "verdicts": [v.as_json() for v in task.verdicts]}, "judge": task.judge})

    def close(self) -> TraceReport:
        """Wait until every trace is written, or the writer stalls for stall_seconds() (then
        it is killed); the report says exactly what was stored."""
        with self._lock:
            self._progress = time.monotonic()  # idle during a slow run is not a stall; the clock starts now
        self._queue.put(None)
        try:
            self._sender.join(self._stall_left())
            while self._sender.is_alive() and self._stall_left() > 0:
                self._sender.join(self._stall_left())
            if self._sender.is_alive():
                raise subprocess.TimeoutExpired("trace writer", stall_seconds())
            try:
                self._process.stdin.close()
            except OSError:
                pass
            while True:
                try:
                    self._process.wait(timeout=max(0.1, self._stall_left()))
                    break
                except subprocess.TimeoutExpired:
                    if self._stall_left() <= 0:
                        raise
        except subprocess.TimeoutExpired:
            self._kill(f"the trace writer stored nothing for {stall_seconds():g} s and was stopped")
        except BaseException:
            self._kill("interrupted while traces were written")
            raise
        self._reader.join(5)
        if self._process.returncode not in (0, None) and (self.report.lost or self.report.problem is None):
            self.report.problem = self.report.problem or f"the trace writer failed (exit {self._process.returncode})"
        return self.report

    def _stall_left(self) -> float:
        with self._lock:
            return self._progress + stall_seconds() - time.monotonic()

    def _kill(self, why: str) -> None:
        self.report.problem = self.report.problem or why
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()


@contextmanager
def tracing(enabled: bool = True, *, inline: bool = False) -> Iterator[TraceReport]:
    """Trace every task and stage in this block (inside a run; a no-op when not
    `enabled`); the report it yields is complete when the block ends. `inline` makes
    real MLflow spans in this process, so they nest under DSPy's own (optimize);
    otherwise the trace writer does the work."""
    from cg_dspy.core.observe import observing

    if not enabled:
        yield TraceReport(traced=False)
        return
    if inline:
        with observing(_Inline()):
            yield TraceReport()
        return
    active = mlflow().active_run()
    writer = TraceWriter(active.info.run_id, active.info.experiment_id, mlflow().get_tracking_uri())
    if writer.failed:
        log.warning("%s", writer.report.warning())
        yield writer.report
        return
    try:
        with observing(writer):
            yield writer.report
    finally:
        writer.close()


def find_traces(run_id: str, *, spans: bool = True) -> list:
    """The traces logged under a run (one per task)."""
    experiment = mlflow().get_run(run_id).info.experiment_id
    return mlflow().search_traces(locations=[experiment], run_id=run_id, return_type="list", include_spans=spans)


def trace_ids(run_id: str) -> dict[str, str]:
    """Task id -> trace id for the traces a run logged."""
    return {t.info.tags.get(TASK_TAG): t.info.trace_id for t in find_traces(run_id, spans=False)
            if t.info.tags.get(TASK_TAG)}
