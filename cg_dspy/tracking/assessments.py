"""A graded task's verdicts as MLflow assessments on the task's trace.

Verdicts travel as typed values (rubric, status, votes, reason), taken from the graded
row's own lists, never parsed back out of its formatted rationale: a reason holding
line breaks (or a forged "Requirement 2: no (...)" line) is one reason of one
requirement. Every assessment of ours carries a mark in its metadata, and grading a
task again first removes the marks the last grading left (a rubric list that changed
leaves no stale verdict behind).
"""

from __future__ import annotations

import re

from cg_dspy.judge.verdicts import Verdict

MARK = "cg_dspy.verdict"  # metadata key on each assessment of ours
MAX_TEXT = 8000  # characters of a rubric or reason kept; longer ones end with CLIPPED
CLIPPED = " … [clipped]"
_OLD_NAME = re.compile(r"R\d{2,}")  # assessments of ours before the mark existed


def clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - len(CLIPPED)] + CLIPPED


def replace_verdicts(trace_id: str, verdicts: list[Verdict], judge: str) -> int:
    """The task's verdicts on its trace, replacing those of an earlier grading; returns how
    many were logged."""
    import mlflow
    from mlflow.entities import AssessmentSource
    from mlflow.tracing.client import TracingClient

    for old in TracingClient().get_trace_info(trace_id).assessments or []:
        if MARK in (old.metadata or {}) or (old.source.source_type == "LLM_JUDGE" and _OLD_NAME.fullmatch(old.name)):
            mlflow.delete_assessment(trace_id=trace_id, assessment_id=old.assessment_id)
    source = AssessmentSource(source_type="LLM_JUDGE", source_id=judge)
    for i, v in enumerate(verdicts):
        # The UI shows an assessment's rationale, not its metadata: say there what was checked.
        rationale = "\n\n".join(filter(None, [clip(v.reason), f"Requirement: {clip(v.rubric)}",
                                               f"Votes: {', '.join(v.votes)}" if v.votes else ""]))
        mlflow.log_feedback(trace_id=trace_id, name=f"R{i + 1:02d}", value=v.status == "yes", source=source,
                            rationale=rationale, metadata={MARK: str(i + 1), "rubric": clip(v.rubric),
                                                           "votes": ",".join(v.votes)})
    return len(verdicts)
