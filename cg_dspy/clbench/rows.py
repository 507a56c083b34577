"""Result and graded rows as typed records, and reading a file of them without losing
a line in silence.

A results file is what `run` writes and CL-bench's `eval.py` reads (`idx`,
`messages`, `model_output`, `rubrics`, `metadata`) plus the trace; a graded file is
CL-bench's graded format (`requirement_status`, `score`, `grading_rationale`) plus our
votes and the generation's cost. Rows from CL-bench's own tools are read too: rubrics
as `{"rubric_criteria": ...}`, statuses as "yes"/"no" in any case (or true/false, 1/0),
`score` as 0/1 or a boolean.

Scoring follows CL-bench's `eval.py`: a task is solved when its `score` is 1; a row
without a score is solved when every requirement status is "yes". Requirement-level
figures read `requirement_status`; a row with no statuses counts every requirement
unsatisfied unless its score says it is solved.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    ValidationError,
    field_validator,
    model_validator,
)

from cg_dspy.clbench.data import RowError, RubricText, explain, with_sub_category
from cg_dspy.core.cost import StageCost
from cg_dspy.core.messages import Message

Status = Literal["yes", "no"]


def _status(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and value in (0, 1):
        return "yes" if value else "no"
    if isinstance(value, str) and value.strip().lower() in ("yes", "no"):
        return value.strip().lower()
    raise ValueError(f"a requirement status is 'yes' or 'no' (or true/false, 1/0), not {value!r}")


def _score(value: object) -> int | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)):
        return int(value)
    raise ValueError(f"score is 0 or 1 (or a boolean), not {value!r}")


StatusValue = Annotated[Status, BeforeValidator(_status)]


class RowMetadata(BaseModel):
    """CL-bench's per-task metadata as a report reads it; unknown keys are kept."""

    model_config = ConfigDict(extra="allow")
    task_id: str | None = None
    context_id: str | None = None
    context_category: str = "unknown"
    sub_category: str = "unknown"

    @field_validator("task_id", "context_id", mode="before")
    @classmethod
    def _text_id(cls, value: object) -> object:
        return str(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else value

    @model_validator(mode="before")
    @classmethod
    def _life_sub_category(cls, data: object) -> object:
        return with_sub_category(data)

    @field_validator("context_category", "sub_category", mode="before")
    @classmethod
    def _known(cls, value: object) -> object:
        return "unknown" if value in (None, "") else value


class Cost(BaseModel):
    """A generation's cost, carried into its graded row."""

    stages: dict[str, StageCost] = {}
    seconds: NonNegativeFloat | None = None


class Row(BaseModel):
    """What every row of ours and CL-bench's shares."""

    model_config = ConfigDict(extra="allow")
    idx: str | None = None
    messages: list[Message] = []
    model_output: str = ""
    rubrics: list[RubricText] = []
    metadata: RowMetadata = Field(default_factory=RowMetadata)
    method: str | None = None
    error: str | None = None

    @field_validator("idx", mode="before")
    @classmethod
    def _text_idx(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("model_output", mode="before")
    @classmethod
    def _output(cls, value: object) -> object:
        return "" if value is None else value

    @property
    def task_id(self) -> str | None:
        """CL-bench's id rule: `metadata.task_id`, else `idx`."""
        return self.metadata.task_id or self.idx


class Trace(BaseModel):
    """What the method did for one task (every stage output is kept, typed or not)."""

    model_config = ConfigDict(extra="allow")
    path: str | None = None
    draft: str | None = None
    cost: dict[str, StageCost] = {}
    failures: list[str] = []
    structured_output: dict[str, str] = {}
    seconds: NonNegativeFloat | None = None


class ResultRow(Row):
    """One generation, as `run` writes it."""

    trace: Trace = Field(default_factory=Trace)


class GradedRow(Row):
    """One graded task."""

    requirement_status: list[StatusValue] = []
    score: Annotated[int | None, BeforeValidator(_score)] = None
    grading_rationale: str = ""
    votes: list[list[StatusValue]] | None = None
    reasons: list[str] | None = None  # the judge's reason per requirement (rubric protocol)
    protocol: str | None = None
    cost: Cost | None = None

    @property
    def satisfied(self) -> list[bool]:
        """One flag per rubric; missing statuses are unsatisfied, unless the score says solved."""
        n = len(self.rubrics)
        flags = [s == "yes" for s in self.requirement_status]
        if not flags and self.score == 1:
            flags = [True] * n
        return (flags + [False] * n)[: max(n, len(flags))]

    @property
    def solved(self) -> bool:
        if self.score is not None:
            return self.score == 1
        flags = self.satisfied
        return bool(flags) and all(flags)

    @property
    def failed(self) -> int:
        return sum(not f for f in self.satisfied)

    @property
    def inconsistent(self) -> bool:
        """The score disagrees with the statuses (the task outcome follows the score)."""
        if self.score is None or not self.requirement_status:
            return False
        return (self.score == 1) != all(s == "yes" for s in self.requirement_status)


@dataclass
class FileRows:
    """The rows of one file and every line that could not be read."""

    path: str
    rows: list[tuple[int, dict]] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)


def read_jsonl(path: str | os.PathLike) -> FileRows:
    """Every line of a JSONL file: a final line without a newline is read, blank lines
    are skipped, and a line that is not a JSON object becomes an error with its line."""
    p = Path(path)
    out = FileRows(str(p))
    if p.is_dir():
        raise IsADirectoryError(f"{p}: is a directory, not a JSONL file")
    with open(p, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                out.errors.append(RowError(str(p), line, None, f"not a JSON line ({exc})"))
                continue
            if not isinstance(row, dict):
                out.errors.append(RowError(str(p), line, None, f"a row is a JSON object, not {type(row).__name__}"))
                continue
            out.rows.append((line, row))
    return out


def validated(file: FileRows, model: type[Row]) -> tuple[list[Row], list[RowError]]:
    """The file's rows as `model`, one per task id by one rule (a later row with no error
    replaces an earlier failed one, the store's own retry); two finished rows for one id,
    or rows without an id, are errors naming their lines."""
    errors = list(file.errors)
    kept: dict[str, tuple[int, Row]] = {}
    for line, raw in file.rows:
        tid = row_id(raw)
        try:
            row = model.model_validate(raw)
        except ValidationError as exc:
            errors.append(RowError(file.path, line, tid, explain(exc)))
            continue
        if row.task_id is None:
            errors.append(RowError(file.path, line, None, "no task id (idx or metadata.task_id)"))
            continue
        earlier = kept.get(row.task_id)
        if earlier is not None and not earlier[1].error:
            if row.error:
                continue  # a failed retry does not undo a finished row
            errors.append(RowError(file.path, line, row.task_id,
                                   f"duplicate task id (also on line {earlier[0]}); merge shards without repeats"))
            continue
        kept[row.task_id] = (line, row)
    return [row for _, row in kept.values()], errors


def row_id(raw: dict) -> str | None:
    """A row's task id by CL-bench's rule, the one every reader and writer uses: the
    metadata's `task_id`, else `idx` (merged shards of CL-bench's own files repeat `idx`,
    never a task id)."""
    meta = raw.get("metadata")
    tid = meta.get("task_id") if isinstance(meta, dict) else None
    tid = tid if tid is not None else raw.get("idx")
    return str(tid) if isinstance(tid, (str, int)) and not isinstance(tid, bool) else None


def graded_rows(rows: Iterable[dict | GradedRow]) -> list[GradedRow]:
    """Graded rows from dicts or rows (the analyses take either)."""
    return [r if isinstance(r, GradedRow) else GradedRow.model_validate(r) for r in rows]
