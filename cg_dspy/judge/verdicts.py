"""What the judge decides, as typed values from the judge to the graded file, the report
and MLflow: a verdict per requirement, a grade per answer, and a graded task as its
trace receives it. Pure data (no LM): the trace writer process reads these too."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Verdict:
    """One requirement's grade: what was checked, the majority label, the votes, why."""

    rubric: str
    status: str  # "yes" | "no"
    votes: tuple[str, ...] = ()
    reason: str = ""

    def as_json(self) -> dict:
        return {"rubric": self.rubric, "status": self.status, "votes": list(self.votes), "reason": self.reason}

    @classmethod
    def from_json(cls, value: dict) -> Verdict:
        return cls(str(value["rubric"]), str(value["status"]), tuple(value.get("votes") or ()),
                   str(value.get("reason") or ""))


def all_satisfied(verdicts: list[Verdict]) -> bool:
    """CL-bench's rule: a task is solved only when every requirement is satisfied."""
    return bool(verdicts) and all(v.status == "yes" for v in verdicts)


def pass_rate(verdicts: list[Verdict]) -> float:
    """The fraction of requirements satisfied (0 without any)."""
    return sum(v.status == "yes" for v in verdicts) / len(verdicts) if verdicts else 0.0


@dataclass(frozen=True)
class Grade:
    """One answer graded against its rubrics (a task is solved only when every
    requirement is satisfied)."""

    verdicts: list[Verdict]
    protocol: str
    rationale: str = ""
    note: str = ""  # what the judge got wrong and how it was read (a short status list)

    @property
    def solved(self) -> bool:
        return all_satisfied(self.verdicts)

    @property
    def pass_rate(self) -> float:
        return pass_rate(self.verdicts)

    @property
    def statuses(self) -> list[str]:
        return [v.status for v in self.verdicts]


@dataclass(frozen=True)
class GradedTask:
    """A graded task as its trace receives it."""

    task_id: str | None
    trace_ref: dict | None
    verdicts: list[Verdict] = field(default_factory=list)
    judge: str = "judge"
