"""Typed contracts between the stages of ContextGuard.

Everything an LM produces is validated once, here, into these models; after that the
code uses plain attributes. Lengths are bounded on purpose: a small model that loops
must hit a limit, not fill the context.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

CATEGORIES: tuple[str, ...] = (
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
)
Category = Literal[
    "Domain Knowledge Reasoning",
    "Rule System Application",
    "Procedural Task Execution",
    "Empirical Discovery & Simulation",
]
Role = Literal["system", "user", "assistant"]
IssueType = Literal["numeric", "comparison", "coverage", "unit", "trend", "evidence"]
SpecialistKind = Literal["format", "procedure", "rules", "empirical"]

# What a stage's cost entry counts: LM calls, answers DSPy's cache served, tokens the
# server reported, replies cut at max_tokens, and the reasoning that came with them.
COST_KEYS = ("calls", "cached", "prompt_tokens", "completion_tokens", "truncated", "reasoning_chars",
             "reasoning_tokens")

# Hard bounds on what any LM's audit or checker output can hold, so a model that loops
# hits a limit; the schema each LM is asked for is tighter (LMSettings.item_limits).
MAX_ITEMS = 48  # items kept per quadrant / per specialist list
MAX_ITEM_CHARS = 1000  # characters kept per item


def _clip(text: object) -> str:
    text = str(text).strip()
    return text if len(text) <= MAX_ITEM_CHARS else text[: MAX_ITEM_CHARS - 1] + "…"


def _clip_list(items: object) -> list:
    if items is None:
        return []
    if not isinstance(items, list):
        items = [items]
    return items[:MAX_ITEMS]


# The bounds are in the JSON schema too, so grammar-constrained decoding stops there.
ItemText = Annotated[str, BeforeValidator(_clip), Field(max_length=MAX_ITEM_CHARS)]


# --- the task -----------------------------------------------------------------------


def rubric_text(value: object) -> object:
    """A rubric's text: CL-bench rows hold strings or `{"rubric_criteria": "..."}`."""
    if isinstance(value, dict) and isinstance(value.get("rubric_criteria"), str):
        return value["rubric_criteria"]
    return value


RubricText = Annotated[str, BeforeValidator(rubric_text)]


class Message(BaseModel):
    """One chat turn, in the OpenAI format CL-bench uses."""

    model_config = ConfigDict(extra="forbid")
    role: Role
    content: str


class TaskMetadata(BaseModel):
    """CL-bench's per-task metadata; unknown keys are kept."""

    model_config = ConfigDict(extra="allow")
    task_id: str = Field(min_length=1)
    context_id: str = Field(min_length=1)
    context_category: Category
    sub_category: str = ""


class Task(BaseModel):
    """One CL-bench row: the whole conversation, its rubrics and its metadata."""

    messages: list[Message] = Field(min_length=1)
    rubrics: list[RubricText] = Field(min_length=1)
    metadata: TaskMetadata

    @field_validator("messages")
    @classmethod
    def _ends_with_user(cls, messages: list[Message]) -> list[Message]:
        if messages[-1].role != "user":
            raise ValueError("the last message must be the user's task request")
        return messages

    @field_validator("rubrics")
    @classmethod
    def _rubrics_are_text(cls, rubrics: list[str]) -> list[str]:
        if any(not r.strip() for r in rubrics):
            raise ValueError("rubrics must be non-empty strings")
        return rubrics

    @property
    def idx(self) -> str:
        return self.metadata.task_id

    @property
    def category(self) -> str:
        return self.metadata.context_category

    @property
    def system(self) -> str:
        """s: the system instruction (empty when the row has none)."""
        return "\n\n".join(m.content for m in self.messages if m.role == "system")

    @property
    def request(self) -> str:
        """q: the final user message, the task request."""
        return self.messages[-1].content


# --- stage outputs ----------------------------------------------------------------------


class AuditItem(BaseModel):
    """One audit finding; empirical findings carry a fine-grained issue type."""

    text: ItemText
    issue_type: IssueType | None = None

    @field_validator("issue_type", mode="before")
    @classmethod
    def _unknown_type_is_none(cls, value: object) -> object:
        allowed = ("numeric", "comparison", "coverage", "unit", "trend", "evidence")
        if isinstance(value, str):
            value = value.strip().lower()
            return value if value in allowed else None
        return None


AuditItems = Annotated[list[AuditItem], BeforeValidator(_clip_list), Field(max_length=MAX_ITEMS)]
SpecialistItems = Annotated[list[ItemText], BeforeValidator(_clip_list), Field(max_length=MAX_ITEMS)]


class AuditReport(BaseModel):
    """The four epistemic quadrants Q_A..Q_D of the structured self-audit."""

    confirmed_correct: AuditItems = []
    confirmed_data: AuditItems = []
    possibly_missed: AuditItems = []
    possibly_wrong: AuditItems = []


class SpecialistReport(BaseModel):
    """A specialist signal normalised to (O_t, E_t): satisfied items and violations."""

    kind: SpecialistKind
    satisfied: SpecialistItems = []
    violations: SpecialistItems = []


FixTag = Literal["MISSED", "WRONG", "FORMAT-FAIL", "PROC-FAIL", "RULES-FAIL", "EMPIRICAL-ISSUE"]
ProtectTag = Literal[
    "CONFIRMED-CORRECT", "CONFIRMED-DATA", "FORMAT-OK", "PROC-OK", "RULES-OK", "EMPIRICAL-OK"
]


class PlanItem(BaseModel):
    """A fix-set or protection-set entry as the revision prompt shows it."""

    tag: FixTag | ProtectTag
    text: str
    issue_type: IssueType | None = None

    def render(self) -> str:
        kind = f" ({self.issue_type})" if self.issue_type else ""
        return f"- [{self.tag}]{kind} {self.text}"


class RevisionPlan(BaseModel):
    """F (what to fix) and P (what to protect) for one protected revision."""

    fix_set: list[PlanItem] = []
    protect_set: list[PlanItem] = []


class GuardVerdict(BaseModel):
    """The revision guard's decision, with every reason it found."""

    passed: bool
    reasons: list[str] = []
    length_ratio: float = 1.0
