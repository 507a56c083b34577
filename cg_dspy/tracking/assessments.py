"""A graded task on its trace, as MLflow's evaluation tools read it.

- `task_solved` (bool: the graded score) and `rubric_pass_rate` (float in [0, 1]): the
  task-level feedback MLflow averages across traces and compares between runs;
- `rubrics`: the task's requirements as an expectation (the ground truth a judge checks);
- one feedback per requirement, named by its requirement type (`requirement/format_lexical`,
  …, `requirement/other`), with the rubric, votes and reason. Named by type, not by
  position: position 3 is a different requirement on every task, so "R03" averaged
  across traces means nothing, while the mean of `requirement/format_lexical` is Table 2's
  pass rate for that type (keyword-typed, offline; the metadata says so).

Verdicts arrive as typed values (judge.verdicts.Verdict), never parsed back out of a
formatted rationale: a reason holding line breaks is one reason of one requirement.
Every assessment of ours carries a mark in its metadata, and grading a task again first
removes what the last grading left (a rubric list that changed leaves nothing stale).
"""

from __future__ import annotations

import re

from cg_dspy.judge.types import OTHER, rubric_type
from cg_dspy.judge.verdicts import Verdict, all_satisfied, pass_rate

MARK = "cg_dspy.verdict"  # metadata key on each assessment of ours
MAX_TEXT = 8000  # characters of a rubric or reason kept; longer ones end with CLIPPED
CLIPPED = " … [clipped]"
_OLD_NAME = re.compile(r"R\d{2,}")  # assessments of ours before the mark existed
TASK_SOLVED, PASS_RATE, RUBRICS = "task_solved", "rubric_pass_rate", "rubrics"


def clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - len(CLIPPED)] + CLIPPED


def requirement_name(rubric: str) -> str:
    """The assessment name of a requirement's verdict: its type, as a metric-safe name."""
    kind = rubric_type(rubric) or OTHER
    return "requirement/" + re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_")


def replace_verdicts(trace_id: str, verdicts: list[Verdict], judge: str) -> int:
    """The task's grade on its trace (task-level feedback, the rubrics as expectation, a
    verdict per requirement), replacing an earlier grading's; returns how many
    requirement verdicts were logged."""
    import mlflow
    from mlflow.entities import AssessmentSource
    from mlflow.tracing.client import TracingClient

    for old in TracingClient().get_trace_info(trace_id).assessments or []:
        if MARK in (old.metadata or {}) or (old.source.source_type == "LLM_JUDGE" and _OLD_NAME.fullmatch(old.name)):
            mlflow.delete_assessment(trace_id=trace_id, assessment_id=old.assessment_id)
    source = AssessmentSource(source_type="LLM_JUDGE", source_id=judge)
    satisfied = sum(v.status == "yes" for v in verdicts)
    summary = f"{satisfied} of {len(verdicts)} requirements satisfied (judge {judge})"
    mlflow.log_expectation(trace_id=trace_id, name=RUBRICS, value=[clip(v.rubric) for v in verdicts],
                           source=AssessmentSource(source_type="HUMAN", source_id="CL-bench"),
                           metadata={MARK: RUBRICS})
    mlflow.log_feedback(trace_id=trace_id, name=TASK_SOLVED, value=all_satisfied(verdicts),
                        source=source, rationale=summary, metadata={MARK: TASK_SOLVED})
    mlflow.log_feedback(trace_id=trace_id, name=PASS_RATE, value=round(pass_rate(verdicts), 6), source=source,
                        rationale=summary, metadata={MARK: PASS_RATE})
    for i, v in enumerate(verdicts):
        # The UI shows an assessment's rationale, not its metadata: say there what was checked.
        rationale = "\n\n".join(filter(None, [clip(v.reason), f"Requirement {i + 1}: {clip(v.rubric)}",
                                               f"Votes: {', '.join(v.votes)}" if v.votes else ""]))
        mlflow.log_feedback(trace_id=trace_id, name=requirement_name(v.rubric), value=v.status == "yes",
                            source=source, rationale=rationale,
                            metadata={MARK: str(i + 1), "rubric": clip(v.rubric), "votes": ",".join(v.votes),
                                      "requirement_typer": "keyword"})
    return len(verdicts)
