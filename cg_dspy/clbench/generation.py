"""Generation runs: a method over tasks, one CL-bench-format row per task.

Rows carry what CL-bench's own `eval.py` reads (`idx`, `messages`, `model_output`,
`rubrics`, `metadata`) plus `trace`, every stage output of the method.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import dspy
import pydantic

from cg_dspy.clbench.data import Task
from cg_dspy.clbench.rows import ResultRow
from cg_dspy.clbench.runner import Outcome, execute
from cg_dspy.clbench.store import ResultStore
from cg_dspy.core.cost import cost_totals
from cg_dspy.core.messages import chat_reply
from cg_dspy.core.observe import span
from cg_dspy.lms import lm_identity, patches, using


def _dump(value):
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value):
        return {f.name: _dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def trace_of(pred: dspy.Prediction) -> dict:
    """Every stage output on a prediction, as plain JSON."""
    data = {k: _dump(v) for k, v in pred.items() if k != "answer"}
    rounds = data.pop("rounds", None)
    if rounds and len(rounds) > 1:
        data["rounds"] = rounds
    data["cost"] = {stage: dict(c) for stage, c in pred.get("cost", {}).items()}
    return data


def input_digest(task: Task, draft: str | None = None) -> str:
    """What a task's row was made from: its messages and rubrics (and a given draft)."""
    body = {"messages": [m.model_dump() for m in task.messages], "rubrics": list(task.rubrics), "draft": draft}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def run_settings(program: dspy.Module, method: str, lm, repeat: int | None = None) -> dict:
    """What produced a results file; a rerun with other settings is not a resume. A
    repeat's number is part of it: repeats of one run differ in nothing else."""
    state = json.dumps(program.dump_state(), sort_keys=True, ensure_ascii=False, default=str)
    settings = {"method": method, "config": program.config(),
                "program": hashlib.sha256(state.encode()).hexdigest()[:16], "task_lm": lm_identity(lm)}
    return {**settings, "repeat": repeat} if repeat else settings


def repeat_path(out: str | os.PathLike, repeat: int) -> Path:
    """Where repeat `repeat` of a run writes: `OUT.jsonl` -> `OUT.r2.jsonl`."""
    out = Path(out)
    return out.with_name(f"{out.stem}.r{repeat}{out.suffix}")


def for_repeat(lm, repeat: int | None):
    """The LM a repeat samples with: its own rollout id, so DSPy's cache never hands one
    repeat another's answers (at temperature 0 a repeat measures only the server's own
    nondeterminism: greedy decoding gives the same answer again)."""
    return lm.copy(rollout_id=repeat) if repeat else lm


def base_row(task: Task, digest: str) -> dict:
    """The CL-bench fields of a result row, and the digest of what made it."""
    return {
        "idx": task.idx,
        "messages": [m.model_dump() for m in task.messages],
        "rubrics": list(task.rubrics),
        "metadata": task.metadata.model_dump(),
        "cg_dspy": {"input": digest},
    }


def generate_row(program: dspy.Module, task: Task, method: str, lm, draft: str | None = None) -> dict:
    """Run one task (one traced span, its stages inside when tracing is on); the row the
    run file stores. The span's inputs are the task and its output the answer, so a trace
    list shows the question and the answer."""
    start = time.perf_counter()
    row = base_row(task, input_digest(task, draft))
    with span(method, messages=row["messages"], category=task.category, task_id=task.idx) as watched, using(lm):
        pred = program(conversation=task.messages, category=task.category, draft=draft)
        trace = {**trace_of(pred), "seconds": round(time.perf_counter() - start, 3)}
        totals = cost_totals(trace["cost"].values())
        watched.set(path=trace.get("path"), fix_set=len(pred.get("fix_set") or []),
                    protect_set=len(pred.get("protect_set") or []), calls=totals["calls"],
                    cached=totals["cached"], prompt_tokens=totals["prompt_tokens"],
                    completion_tokens=totals["completion_tokens"], outputs=chat_reply(pred.answer))
    if watched.trace_ref:
        trace["mlflow"] = watched.trace_ref  # where this task's trace is (a trace id, or its run)
    return {**row, "model_output": pred.answer, "method": method, "trace": trace}


@dataclass
class RunResult:
    """What a run did: the outcome of this invocation and the summary of the whole file."""

    outcome: Outcome
    summary: dict
    rows: list[dict]
    differences: list[str]  # settings that differ from resumed rows (resume_anyway)


def run(
    program: dspy.Module,
    tasks: list[Task],
    out: str | os.PathLike,
    *,
    lm,
    method: str,
    threads: int = 4,
    drafts: dict[str, str] | None = None,
    progress: bool = True,
    force: bool = False,
    resume_anyway: bool = False,
    inputs: tuple = (),
    repeat: int | None = None,
) -> RunResult:
    """Generate every task not yet in the results file `out`; `drafts` pairs methods on
    the same draft; `repeat` (1, 2, …) makes this run one of several independent samples
    (`for_repeat`). A task whose input changed since its row was written is done again."""
    patches.install()
    lm = for_repeat(lm, repeat)
    before = lm.endpoint_stats() if hasattr(lm, "endpoint_stats") else None
    drafts = drafts or {}
    by_id = {t.idx: t for t in tasks}
    digests = {t.idx: input_digest(t, drafts.get(t.idx)) for t in tasks}
    jobs = [(t.idx, lambda t=t: generate_row(program, t, method, lm, drafts.get(t.idx))) for t in tasks]

    def failed_row(idx: str, reason: str) -> dict:
        return {**base_row(by_id[idx], digests[idx]), "model_output": "", "method": method, "trace": {}}

    def paths(rows: list[dict]) -> dict:
        return dict(Counter((r.get("trace") or {}).get("path", "failed") for r in rows))

    with ResultStore(out, kind="results", run=run_settings(program, method, lm, repeat), inputs=inputs, force=force,
                     resume_anyway=resume_anyway) as store:
        store.discard(i for i, r in store.rows.items() if i in digests and r["cg_dspy"].get("input") != digests[i])
        outcome = execute(jobs, store, threads=threads, desc=method, postfix=paths, progress=progress,
                          error_row=failed_row)
        summary = summarize(outcome, store)
        if before is not None:  # several replicas: this run's tasks, calls, failures, seconds of each
            summary["endpoints"] = lm.endpoint_stats(since=before)
        return RunResult(outcome, summary, list(store.rows.values()), store.differences)


def summarize(outcome: Outcome, store: ResultStore) -> dict:
    """Tasks, paths taken, LM calls, tokens and failures over the whole result file."""
    traces = [ResultRow.model_validate(r).trace for r in store.rows.values()]
    totals = cost_totals(c.model_dump() for t in traces for c in t.cost.values())
    return {
        "tasks": len(traces) + len(outcome.failed),
        "finished": len(traces),
        "resumed": outcome.skipped,
        "failed": len(outcome.failed),
        "paths": dict(Counter(t.path or "?" for t in traces)),
        "lm_calls": totals["calls"],
        "cached_answers": totals["cached"],
        "prompt_tokens": totals["prompt_tokens"],
        "cached_prompt_tokens": totals["cached_prompt_tokens"],
        "completion_tokens": totals["completion_tokens"],
        "truncated_replies": totals["truncated"],
        "reasoning_chars": totals["reasoning_chars"],
        "structured_output": dict(Counter(mode for t in traces for mode in t.structured_output.values())),
        "seconds": round(outcome.seconds, 2),
        "interrupted": outcome.interrupted,
    }
