"""Rubric judging (paper Appendix C, Prompt 8) and CL-bench's joint protocol.

`rubric` protocol: each requirement is judged alone, K votes drawn as distinct samples
(each vote has its own `rollout_id`, so the cache never hands back a repeat), label =
majority (yes only if yes-votes > K/2). Voting stops as soon as the remaining votes
cannot change the majority: same labels as full K, fewer calls.
`joint` protocol: all rubrics in one prompt, as CL-bench's official `eval.py` does.
A task is solved only when every requirement is satisfied.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import dspy
import pydantic
from dspy.utils.exceptions import AdapterParseError

from cg_dspy.adapter import JSONAdapter
from cg_dspy.runner import Outcome, execute
from cg_dspy.signatures import JudgeAllRubrics, JudgeRequirement
from cg_dspy.store import ResultStore, read_rows, row_id

PROTOCOLS = ("rubric", "joint")


def majority_decided(yes: int, no: int, k: int) -> bool:
    """True once the majority label over k votes can no longer change."""
    remaining = k - yes - no
    return yes > k / 2 or yes + remaining <= k / 2


def majority_label(votes: list[str], k: int) -> str:
    """'yes' only if more than half of the k votes are 'yes' (Eq. 13)."""
    return "yes" if sum(v == "yes" for v in votes) > k / 2 else "no"


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
        """One judge sample; unusable output counts as 'no' (yes must be clear)."""
        try:
            out = self.judge(response=response, requirement=requirement, config={"rollout_id": k})
        except (AdapterParseError, pydantic.ValidationError) as exc:
            return {"status": "no", "reason": "", "error": f"unparseable judge output: {type(exc).__name__}"}
        return {"status": out.satisfaction_status, "reason": out.reason}


class JointJudge(dspy.Module):
    """CL-bench's official protocol: every rubric in one prompt, all-or-nothing."""

    def __init__(self):
        super().__init__()
        self.judge = dspy.Predict(JudgeAllRubrics)

    def forward(self, response: str, rubrics: list[str]) -> dspy.Prediction:
        numbered = "\n".join(f"{i + 1}. {r}" for i, r in enumerate(rubrics))
        note = ""
        try:
            out = self.judge(response=response, rubrics=numbered)
            status, rationale = list(out.requirement_status or []), out.grading_rationale
        except (AdapterParseError, pydantic.ValidationError) as exc:
            status, rationale, note = [], "", f"unparseable judge output: {type(exc).__name__}"
        if len(status) != len(rubrics):
            note = note or f"judge gave {len(status)} labels for {len(rubrics)} rubrics; missing ones are 'no'"
            status = (status + ["no"] * len(rubrics))[: len(rubrics)]
        return dspy.Prediction(status=status, rationale=rationale, note=note)


def generation_cost(row: dict) -> dict:
    """The method and its LM cost, carried from a result row into its graded row."""
    trace = row.get("trace") or {}
    out = {"method": row["method"]} if row.get("method") else {}
    if trace.get("cost") is not None:
        out["cost"] = {"stages": trace["cost"], "seconds": trace.get("seconds")}
    return out


def _graded(row: dict, protocol: str) -> dict:
    """A graded row's CL-bench fields, its protocol and the generation's cost."""
    kept = {k: row[k] for k in ("idx", "messages", "model_output", "rubrics", "metadata") if k in row}
    return {**kept, "protocol": protocol, **generation_cost(row)}


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
        with dspy.context(lm=judge_lm, adapter=JSONAdapter()):
            out = JointJudge()(response=output, rubrics=rubrics)
        graded.update(requirement_status=out.status, grading_rationale=out.rationale)
        if out.note:
            graded["judge_note"] = out.note
    elif protocol == "rubric":
        judge = RubricJudge(votes=votes, early_stop=early_stop)

        def one(requirement: str):
            with dspy.context(lm=judge_lm, adapter=JSONAdapter()):
                return judge(response=output, requirement=requirement)

        results = list(pool.map(one, rubrics)) if pool else [one(r) for r in rubrics]
        graded["requirement_status"] = [r.status for r in results]
        graded["votes"] = [[v["status"] for v in r.votes] for r in results]
        graded["grading_rationale"] = "\n".join(
            f"Requirement {i + 1}: {r.status} ({(r.votes[-1].get('reason') or '').strip()[:300]})"
            for i, r in enumerate(results)
        )
        notes = [v["error"] for r in results for v in r.votes if v.get("error")]
        if notes:
            graded["judge_note"] = f"{len(notes)} unparseable vote(s) counted as 'no'"
    else:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {PROTOCOLS}")
    graded["score"] = int(bool(rubrics) and all(s == "yes" for s in graded["requirement_status"]))
    return graded


def running_tsr(rows: list[dict]) -> dict:
    """Progress-bar postfix: the task-solving rate so far."""
    graded = [r for r in rows if not r.get("error")]
    solved = sum(r.get("score", 0) for r in graded)
    return {"TSR": f"{100 * solved / len(graded):.1f}%" if graded else "-"}



def grade_file(
    rows: list[dict],
    out: str,
    *,
    judge_lm,
    protocol: str = "rubric",
    votes: int = 3,
    early_stop: bool = True,
    threads: int = 4,
    progress: bool = True,
) -> tuple[Outcome, list[dict]]:
    """Grade result rows into `out`, resumably. Requirement calls of all tasks share one
    pool of `threads`, so N judge requests stay in flight across tasks and requirements."""
    source = {row_id(r): r for r in rows}

    def failed(idx: str, reason: str) -> dict:
        """A task whose grading failed: unsolved in every report, graded again on rerun."""
        return unsolved(source[idx], protocol, f"Grading failed: {reason}")

    with ResultStore(out) as store, ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        # A graded answer that no longer matches its result row (the task was rerun) is stale.
        store.discard(i for i, g in store.rows.items()
                      if i in source and g.get("model_output") != source[i].get("model_output"))
        jobs = [
            (row_id(r), lambda r=r: grade_row(
                r, protocol=protocol, judge_lm=judge_lm, votes=votes, early_stop=early_stop, pool=pool))
            for r in rows
        ]
        outcome = execute(jobs, store, threads=threads, desc="judge", postfix=running_tsr,
                          progress=progress, error_row=failed)
    return outcome, read_rows(out)
