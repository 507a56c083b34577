"""Typed contracts between the stages of ContextGuard.

Everything an LM produces is validated once, here, into these models; after that the
code uses plain attributes. Lengths are bounded on purpose: a small model that loops
must hit a limit, not fill the context.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from cg_dspy.core.messages import CATEGORIES, Category, Message  # noqa: F401 - their old home, kept importable
from cg_dspy.lms.embedded import UNBOUNDED

IssueType = Literal["numeric", "comparison", "coverage", "unit", "trend", "evidence"]

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


# --- stage outputs ----------------------------------------------------------------------


class TextFirst(BaseModel):
    """An item a model may give as a bare string: the string is the item's `text` (real
    models often list findings that way; a bare edit is text with no action, kept to be
    dropped with its reason)."""

    @model_validator(mode="before")
    @classmethod
    def _bare_text(cls, value: object) -> object:
        return {"text": value} if isinstance(value, str) else value


class AuditItem(TextFirst):
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

    kind: str
    satisfied: SpecialistItems = []
    violations: SpecialistItems = []


class PlanItem(BaseModel):
    """A fix-set or protection-set entry as the revision prompt shows it (Prompt 7's
    tags: MISSED, WRONG and CONFIRMED-* from the audit, the rest from a specialist)."""

    tag: str
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


# --- edit-mode revision ---------------------------------------------------------------

EditAction = Literal["replace", "insert_after", "append"]
# An edit's passage and text are never clipped (a clipped passage would replace only its
# start) nor bounded in the output schema (a grammar would clip them the same way): a
# model that loops is stopped by max_tokens, and the cut edit is dropped.
_ACTION_WORDS = {"replace": "replace", "insert_after": "insert_after", "insert": "insert_after",
                 "insert after": "insert_after", "append": "append", "add": "append"}


def _edit_text(value: object) -> str | None:
    return None if value is None else str(value)


EditText = Annotated[str | None, BeforeValidator(_edit_text), Field(json_schema_extra={UNBOUNDED: True})]


class Edit(TextFirst):
    """One targeted edit of the current answer, tied to the fix-set item it addresses.

    Every field is lenient (a missing or unknown value parses as None): which edits
    apply is decided by `method.edits.apply_edits`, which drops an unusable one with its
    reason instead of losing the whole list to one bad item. The schema a model is
    asked for requires every field."""

    model_config = ConfigDict(json_schema_extra={"required": ["fix_item", "action", "target", "text"]})
    fix_item: int | None = None  # the fix set's item number, as the prompt numbers them
    action: EditAction | None = None
    target: EditText = None  # replace: the exact passage; insert_after: the exact anchor
    text: EditText = None  # the new passage ("" deletes it), or the text inserted or appended

    @field_validator("action", mode="before")
    @classmethod
    def _action(cls, value: object) -> object:
        return _ACTION_WORDS.get(value.strip().lower()) if isinstance(value, str) else None

    @field_validator("fix_item", mode="before")
    @classmethod
    def _item(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().isdigit():
            return int(value.strip())
        return value if isinstance(value, int) and not isinstance(value, bool) else None


EditItems = Annotated[list[Edit], BeforeValidator(_clip_list), Field(max_length=MAX_ITEMS)]


class DroppedEdit(BaseModel):
    edit: int  # counted from 1, in the order the model gave the edits
    reason: str


class EditReport(BaseModel):
    """What an edit-mode revision did: the edits as given, the numbers of those applied,
    and each dropped one with its reason."""

    edits: list[Edit] = []
    applied: list[int] = []
    dropped: list[DroppedEdit] = []
