"""Rubric judging (paper Appendix C, Prompt 8) and CL-bench's joint protocol.

`rubric` protocol: each requirement is judged alone, K votes drawn as distinct samples
(each vote has its own `rollout_id`, so the cache never hands back a repeat), label =
majority (yes only if yes-votes > K/2). Voting stops as soon as the remaining votes
cannot change the majority: same labels as full K, fewer calls.
`joint` protocol: all rubrics in one prompt, as CL-bench's official `eval.py` does.
A task is solved only when every requirement is satisfied.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import dspy
import pydantic
from dspy.utils.exceptions import AdapterParseError

from cg_dspy.evaluation.runner import Outcome, execute
from cg_dspy.evaluation.store import ResultStore, row_id
from cg_dspy.lms import lm_identity, patches, using
from cg_dspy.method.signatures import JudgeAllRubrics, JudgeLabel, JudgeRequirement
from cg_dspy.method.stages import annotate, span

PROTOCOLS = ("rubric", "joint")


def majority_decided(yes: int, no: int, k: int) -> bool:
    """True once the majority label over k votes can no longer change."""
    remaining = k - yes - no
    return yes > k / 2 or yes + remaining <= k / 2


def majority_label(votes: list[str], k: int) -> str:
    """'yes' only if more than half of the k votes are 'yes' (Eq. 13)."""
    return "yes" if sum(v == "yes" for v in votes) > k / 2 else "no"


JUDGE_ATTEMPTS = 3


class JudgeFailure(Exception):
    """The judge gave no usable verdict, even when asked again: the task is not graded."""


def ask(predictor, what: str, *, rollout: int | None = 0, **inputs):
    """`predictor(**inputs)`, asked again up to JUDGE_ATTEMPTS times while the reply
    does not parse; each attempt is its own sample (its own cache entry). `rollout=None`
    for an LM without a cache, at temperature 0, where a rollout id means nothing."""
    for attempt in range(JUDGE_ATTEMPTS):
        config = {} if rollout is None else {"config": {"rollout_id": rollout + 1000 * attempt}}
        try:
            return predictor(**inputs, **config)
        except (AdapterParseError, pydantic.ValidationError) as exc:
            last = exc
    first = (str(last).strip().splitlines() or [""])[0][:200]
    raise JudgeFailure(f"no usable judge verdict for {what} after {JUDGE_ATTEMPTS} tries "
                       f"({type(last).__name__}: {first})")


class RubricJudge(dspy.Module):
    """Per-requirement judge with K votes and early-stopped majority."""

    def __init__(self, votes: int = 3, early_stop: bool = True):
        super().__init__()
        if votes < 1:
            raise ValueError("votes must be at least 1")
        self.votes = votes
        self.early_stop = early_stop
        self.judge = dspy.Predict(JudgeRequirement)

    def forward(self, response: str, requirement: str) -> dspy.Prediction:
        votes: list[dict] = []
        yes = no = 0
        for k in range(self.votes):
            if self.early_stop and majority_decided(yes, no, self.votes):
                break
            vote = self.vote(response, requirement, k)
            votes.append(vote)
            yes += vote["status"] == "yes"
            no += vote["status"] != "yes"
        labels = [v["status"] for v in votes]
        return dspy.Prediction(status=majority_label(labels, self.votes), votes=votes)

    def vote(self, response: str, requirement: str, k: int) -> dict:
        """One judge sample. A reply that does not parse is asked for again (a fresh
        sample each time); after `JUDGE_ATTEMPTS` the vote is a JudgeFailure, never a 'no'."""
        out = ask(self.judge, f"requirement {requirement[:80]!r}", response=response, requirement=requirement,
                  rollout=k)
        return {"status": out.satisfaction_status, "reason": out.reason}


@functools.lru_cache(maxsize=256)
def statuses(n: int) -> type[pydantic.RootModel]:
    """The joint judge's status list for a task of `n` requirements: its schema asks for
    exactly n labels (a grammar-constrained server produces n), while a reply of another
    length still parses and is padded below."""
    return type(f"RequirementStatuses{n}", (pydantic.RootModel[list[JudgeLabel]],),
                {"model_config": pydantic.ConfigDict(json_schema_extra={"minItems": n, "maxItems": n})})


class JointJudge(dspy.Module):
    """CL-bench's official protocol: every rubric in one prompt, all-or-nothing."""

    def __init__(self):
        super().__init__()
        self.judge = dspy.Predict(JudgeAllRubrics)

    def forward(self, response: str, rubrics: list[str]) -> dspy.Prediction:
        numbered = "\n".join(f"{i + 1}. {r}" for i, r in enumerate(rubrics))
        note = ""
        sized = dspy.Predict(self.judge.signature.with_updated_fields("requirement_status",
                                                                      type_=statuses(len(rubrics))))
        sized.demos = self.judge.demos
        out = ask(sized, "the rubric list", response=response, rubrics=numbered)
        found = out.requirement_status
        status, rationale = list(getattr(found, "root", found) or []), out.grading_rationale
        if len(status) != len(rubrics):
            note = f"judge gave {len(status)} labels for {len(rubrics)} rubrics; missing ones are 'no'"
            status = (status + ["no"] * len(rubrics))[: len(rubrics)]
        return dspy.Prediction(status=status, rationale=rationale, note=note)


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


def grade_row(
    row: dict,
    *,
    protocol: str,
    judge_lm,
    votes: int = 3,
    early_stop: bool = True,
    pool: ThreadPoolExecutor | None = None,
) -> dict:
    """The official graded row for one result row, plus each requirement's votes.

    A missing or failed generation is graded without any judge call: every requirement
    unsatisfied, score 0.
    """
    output = row.get("model_output") or ""
    if row.get("error") or not output.strip():
        reason = row.get("error") or "empty model output"
        return unsolved(row, protocol, f"No usable model output ({reason}); every requirement counts as unsatisfied.")
    rubrics = list(row.get("rubrics") or [])
    graded = _graded(row, protocol)
    if protocol == "joint":
        with using(judge_lm):
            out = JointJudge()(response=output, rubrics=rubrics)
        graded.update(requirement_status=out.status, grading_rationale=out.rationale)
        if out.note:
            graded["judge_note"] = out.note
    elif protocol == "rubric":
        judge = RubricJudge(votes=votes, early_stop=early_stop)

        def one(requirement: str):
            with using(judge_lm):
                return judge(response=output, requirement=requirement)

        results = list(pool.map(one, rubrics)) if pool else [one(r) for r in rubrics]
        graded["requirement_status"] = [r.status for r in results]
        graded["votes"] = [[v["status"] for v in r.votes] for r in results]
        # Each requirement's reason as typed data (what MLflow gets); the rationale is for
        # reading, one line per requirement, so a reason can never pose as another line.
        graded["reasons"] = [(r.votes[-1].get("reason") or "").strip() for r in results]
        graded["grading_rationale"] = "\n".join(
            f"Requirement {i + 1}: {r.status} ({' '.join(reason.split())[:300]})"
            for i, (r, reason) in enumerate(zip(results, graded["reasons"]))
        )
    else:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {PROTOCOLS}")
    graded["score"] = int(bool(rubrics) and all(s == "yes" for s in graded["requirement_status"]))
    return graded


_TRACE_REF = {"trace_id": re.compile(r"tr-[0-9a-f]{32}"), "run_id": re.compile(r"[0-9a-f]{32}")}


def trace_ref(row: dict) -> dict | None:
    """Where a result row's trace is, if it says so in a form this project writes."""
    ref = (row.get("trace") or {}).get("mlflow")
    if isinstance(ref, dict) and len(ref) == 1:
        (key, value), = ref.items()
        if key in _TRACE_REF and isinstance(value, str) and _TRACE_REF[key].fullmatch(value):
            return {key: value}
    return None


def traced_grade(row: dict, **options) -> dict:
    """`grade_row`, its verdicts meant for the task's trace: the one its generation
    recorded, else (a results file without one) a span opened for the grading."""
    ref = trace_ref(row)
    if ref is not None:
        graded = grade_row(row, **options)
    else:
        with span("judge", task_id=row_id(row), protocol=options.get("protocol")) as watched:
            graded = grade_row(row, **options)
            watched.set(score=graded["score"], satisfied=sum(s == "yes" for s in graded["requirement_status"]),
                        requirements=len(graded["requirement_status"]))
        ref = watched.trace_ref
    if ref:
        graded["cg_dspy"]["trace"] = ref
        annotate(graded, judge=getattr(options.get("judge_lm"), "model", "judge"))
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


def grade_file(
    rows: list,
    out: str,
    *,
    judge_lm,
    protocol: str = "rubric",
    votes: int = 3,
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
    with ResultStore(out, kind="graded", run=settings, inputs=inputs, force=force,
                     resume_anyway=resume_anyway) as store, ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        store.discard(i for i, g in store.rows.items()
                      if i in source and g["cg_dspy"].get("input") != graded_input(source[i]))
        def job(r: dict) -> dict:
            return traced_grade(r, protocol=protocol, judge_lm=judge_lm, votes=votes, early_stop=early_stop,
                                pool=pool)

        jobs = [(row_id(r), lambda r=r: job(r)) for r in rows]
        outcome = execute(jobs, store, threads=threads, desc="judge", postfix=running_tsr,
                          progress=progress, error_row=failed)
        return GradeResult(outcome, list(store.rows.values()) + [r for r in outcome.rows if r.get("error")],
                           store.differences)
