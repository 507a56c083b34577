"""Generation runs: a method over tasks, one CL-bench-format row per task.

Rows carry what CL-bench's own `eval.py` reads (`idx`, `messages`, `model_output`,
`rubrics`, `metadata`) plus `trace`, every stage output of the method.
"""

from __future__ import annotations

import time
from collections import Counter

import dspy
import pydantic

from cg_dspy.adapter import ConversationAdapter
from cg_dspy.analysis import cost_totals
from cg_dspy.baselines import Baseline, SelfRefine
from cg_dspy.program import ABLATIONS, ContextGuard
from cg_dspy.runner import Outcome, execute
from cg_dspy.schemas import Task
from cg_dspy.store import ResultStore

METHODS = ("baseline", "self-refine", "contextguard")


def method_names() -> list[str]:
    """Every method `bench` knows: the three methods and each single ablation."""
    return [*METHODS, *(f"contextguard-no-{a}" for a in ABLATIONS)]


def build_program(method: str, ablate: tuple[str, ...] | list[str] = (), max_rounds: int = 1,
                  **options) -> dspy.Module:
    """The module for a method name; `contextguard-no-X` is ContextGuard with X ablated.
    `options` (min_length_ratio, policy) go to ContextGuard."""
    if method == "baseline":
        return Baseline()
    if method == "self-refine":
        return SelfRefine()
    if method == "contextguard":
        return ContextGuard(ablate=ablate, max_rounds=max_rounds, **options)
    if method.startswith("contextguard-no-"):
        return ContextGuard(ablate=(*ablate, method.removeprefix("contextguard-no-")), max_rounds=max_rounds,
                            **options)
    raise ValueError(f"unknown method {method!r}; choose from {method_names()}")


def _dump(value):
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
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


def base_row(task: Task) -> dict:
    """The CL-bench fields of a result row."""
    return {
        "idx": task.idx,
        "messages": [m.model_dump() for m in task.messages],
        "rubrics": list(task.rubrics),
        "metadata": task.metadata.model_dump(),
    }


def generate_row(program: dspy.Module, task: Task, method: str, lm, draft: str | None = None) -> dict:
    """Run one task; the row the run file stores."""
    start = time.perf_counter()
    with dspy.context(lm=lm, adapter=ConversationAdapter()):
        pred = program(conversation=task.messages, category=task.category, draft=draft)
    trace = {**trace_of(pred), "seconds": round(time.perf_counter() - start, 3)}
    return {**base_row(task), "model_output": pred.answer, "method": method, "trace": trace}


def run(
    program: dspy.Module,
    tasks: list[Task],
    store: ResultStore,
    *,
    lm,
    method: str,
    threads: int = 4,
    drafts: dict[str, str] | None = None,
    progress: bool = True,
) -> Outcome:
    """Generate every task not yet in `store`; `drafts` pairs methods on the same draft."""
    by_id = {t.idx: t for t in tasks}
    jobs = [
        (t.idx, lambda t=t: generate_row(program, t, method, lm, (drafts or {}).get(t.idx)))
        for t in tasks
    ]

    def failed_row(idx: str, reason: str) -> dict:
        return {**base_row(by_id[idx]), "model_output": "", "method": method, "trace": {}}

    def paths(rows: list[dict]) -> dict:
        return dict(Counter(r.get("trace", {}).get("path", "failed") for r in rows))

    return execute(jobs, store, threads=threads, desc=method, postfix=paths, progress=progress, error_row=failed_row)


def summarize(outcome: Outcome, store: ResultStore) -> dict:
    """Tasks, paths taken, LM calls, tokens and failures over the whole result file."""
    rows = list(store.rows.values())
    paths = Counter(r.get("trace", {}).get("path", "?") for r in rows)
    totals = cost_totals(c for r in rows for c in (r.get("trace", {}).get("cost") or {}).values())
    return {
        "tasks": len(rows) + len(outcome.failed),
        "finished": len(rows),
        "resumed": outcome.skipped,
        "failed": len(outcome.failed),
        "paths": dict(paths),
        "lm_calls": totals["calls"],
        "cached_answers": totals["cached"],
        "prompt_tokens": totals["prompt_tokens"],
        "completion_tokens": totals["completion_tokens"],
        "truncated_replies": totals["truncated"],
        "reasoning_chars": totals["reasoning_chars"],
        "structured_output": dict(Counter(mode for r in rows
                                          for mode in (r.get("trace", {}).get("structured_output") or {}).values())),
        "seconds": round(outcome.seconds, 2),
        "interrupted": outcome.interrupted,
    }
