"""Grading a results file: each result row judged (cg_dspy.judge) into CL-bench's graded
format, resumably, with every requirement's votes and reason, and the grade handed to
whoever watches (a task's trace). A missing or failed generation is unsolved without a
judge call.
"""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cg_dspy.clbench.data import rubric_text
from cg_dspy.clbench.runner import Outcome, execute
from cg_dspy.clbench.store import ResultStore, row_id
from cg_dspy.core import observe
from cg_dspy.core.messages import chat_reply
from cg_dspy.core.observe import span, trace_reference
from cg_dspy.judge.verdicts import Grade, GradedTask, Verdict
from cg_dspy.judge.voting import DEFAULT_VOTES, grade
from cg_dspy.lms import lm_identity, patches
from cg_dspy.lms.replicas import pinned


def generation_cost(row: dict) -> dict:
    """The method, its settings and its LM cost, carried from a result row into its graded row."""
    trace = row.get("trace") or {}
    out = {"method": row["method"]} if row.get("method") else {}
    if trace.get("cost") is not None:
        out["cost"] = {"stages": trace["cost"], "seconds": trace.get("seconds")}
    return out


def graded_input(row: dict) -> str:
    """What a graded row was made from: the answer and the rubrics it was judged on."""
    body = {"model_output": row.get("model_output") or "", "rubrics": list(row.get("rubrics") or [])}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]


def _graded(row: dict, protocol: str) -> dict:
    """A graded row's CL-bench fields, its protocol and the generation's cost."""
    kept = {k: row[k] for k in ("idx", "messages", "model_output", "rubrics", "metadata") if k in row}
    generation = (row.get("cg_dspy") or {}).get("run")
    block = {"input": graded_input(row), **({"generation": generation} if generation else {})}
    return {**kept, "protocol": protocol, **generation_cost(row), "cg_dspy": block}


def unsolved(row: dict, protocol: str, rationale: str) -> dict:
    """A graded row with every requirement unsatisfied, made without a judge call."""
    return {**_graded(row, protocol), "requirement_status": ["no"] * len(row.get("rubrics") or []),
            "score": 0, "grading_rationale": rationale}


def grade_row(row: dict, *, protocol: str, judge_lm, votes: int = DEFAULT_VOTES, early_stop: bool = True,
              pool: ThreadPoolExecutor | None = None) -> tuple[dict, Grade | None]:
    """The official graded row for one result row, plus each requirement's votes and reason,
    and the grade itself (typed). A missing or failed generation is graded without any
    judge call: every requirement unsatisfied, score 0 (and so on its trace)."""
    output = row.get("model_output") or ""
    rubrics = [str(rubric_text(r)) for r in row.get("rubrics") or []]
    if row.get("error") or not output.strip():
        reason = f"No usable model output ({row.get('error') or 'empty model output'})"
        graded = unsolved(row, protocol, f"{reason}; every requirement counts as unsatisfied.")
        return graded, Grade([Verdict(r, "no", (), reason) for r in rubrics], protocol, graded["grading_rationale"])
    found = grade(output, rubrics, judge_lm=judge_lm, protocol=protocol, votes=votes, early_stop=early_stop,
                  pool=pool)
    graded = {**_graded(row, protocol), "requirement_status": found.statuses, "grading_rationale": found.rationale,
              "score": int(found.solved)}
    if protocol == "rubric":
        graded["votes"] = [list(v.votes) for v in found.verdicts]
        graded["reasons"] = [v.reason for v in found.verdicts]  # typed, whole: what MLflow gets
    if found.note:
        graded["judge_note"] = found.note
    return graded, found


def traced_grade(row: dict, **options) -> dict:
    """`grade_row`, its grade handed to whoever watches, for the task's trace: the one its
    generation recorded, else (a results file without one) a span opened for the grading."""
    ref = trace_reference((row.get("trace") or {}).get("mlflow"))
    if ref is not None:
        graded, found = grade_row(row, **options)
    else:
        with span("judge", messages=row.get("messages") or [], task_id=row_id(row),
                  protocol=options.get("protocol")) as watched:
            graded, found = grade_row(row, **options)
            watched.set(score=graded["score"], satisfied=sum(s == "yes" for s in graded["requirement_status"]),
                        requirements=len(graded["requirement_status"]),
                        outputs=chat_reply(row.get("model_output") or ""))
        ref = watched.trace_ref
    if ref:
        graded["cg_dspy"]["trace"] = ref
        observe.graded(GradedTask(row_id(row), ref, found.verdicts, getattr(options.get("judge_lm"), "model", "judge")))
    return graded


def running_tsr(rows: list[dict]) -> dict:
    """Progress-bar postfix: the task-solving rate so far."""
    graded = [r for r in rows if not r.get("error")]
    solved = sum(r.get("score", 0) for r in graded)
    return {"TSR": f"{100 * solved / len(graded):.1f}%" if graded else "-"}


def grade_settings(*, protocol: str, votes: int, early_stop: bool, judge_lm) -> dict:
    """What produced a graded file; regrading with other settings is not a resume."""
    return {"protocol": protocol, "votes": votes if protocol == "rubric" else None,
            "early_stop": early_stop if protocol == "rubric" else None, "judge_lm": lm_identity(judge_lm)}


@dataclass
class GradeResult:
    """What grading did: the outcome of this invocation and every graded row of the file."""

    outcome: Outcome
    rows: list[dict]
    differences: list[str]  # settings that differ from resumed rows (resume_anyway)
    endpoints: dict | None = None  # several judge replicas: calls, failures and seconds of each


def grade_file(
    rows: list,
    out: str,
    *,
    judge_lm,
    protocol: str = "rubric",
    votes: int = DEFAULT_VOTES,
    early_stop: bool = True,
    threads: int = 4,
    progress: bool = True,
    force: bool = False,
    resume_anyway: bool = False,
    inputs: tuple = (),
) -> GradeResult:
    """Grade result rows (dicts or ResultRows) into `out`, resumably. Requirement calls of
    all tasks share one pool of `threads`, so N judge requests stay in flight across
    tasks and requirements. A graded row whose answer or rubrics changed is graded again."""
    patches.install()
    rows = [r.model_dump(mode="json") if hasattr(r, "model_dump") else r for r in rows]
    source = {row_id(r): r for r in rows}

    def failed(idx: str, reason: str) -> dict:
        """A task whose grading failed: unsolved in every report, graded again on rerun."""
        return unsolved(source[idx], protocol, f"Grading failed: {reason}")

    settings = grade_settings(protocol=protocol, votes=votes, early_stop=early_stop, judge_lm=judge_lm)
    before = judge_lm.endpoint_stats() if hasattr(judge_lm, "endpoint_stats") else None
    with ResultStore(out, kind="graded", run=settings, inputs=inputs, force=force,
                     resume_anyway=resume_anyway) as store, ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        store.discard(i for i, g in store.rows.items()
                      if i in source and g["cg_dspy"].get("input") != graded_input(source[i]))
        def job(r: dict) -> dict:
            with pinned(("grade", row_id(r))):  # a task's votes go to one judge replica
                return traced_grade(r, protocol=protocol, judge_lm=judge_lm, votes=votes, early_stop=early_stop,
                                    pool=pool)

        jobs = [(row_id(r), lambda r=r: job(r)) for r in rows]
        outcome = execute(jobs, store, threads=threads, desc="judge", postfix=running_tsr,
                          progress=progress, error_row=failed)
        endpoints = judge_lm.endpoint_stats(since=before) if before is not None else None
        return GradeResult(outcome, list(store.rows.values()) + [r for r in outcome.rows if r.get("error")],
                           store.differences, endpoints)
