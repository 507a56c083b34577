"""Fix set and protection set (paper Eq. 8-9, Table 7): pure functions, no LM, no I/O.

    F = Q_C ∪ Q_D ∪ E_t        P = Q_A ∪ Q_B ∪ O_t

Each entry keeps the tag the revision prompt shows (Prompt 7), so the revision model
knows where an item came from.
"""

from __future__ import annotations

import re

from cg_dspy.method.schemas import AuditItem, AuditReport, PlanItem, RevisionPlan, SpecialistReport
from cg_dspy.method.specialists import SPECIALISTS


def _key(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def _union(items: list[PlanItem]) -> list[PlanItem]:
    """Set union on normalised text, first occurrence wins, order kept."""
    seen: set[str] = set()
    out = []
    for item in items:
        key = _key(item.text)
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _audit_fix_item(item: AuditItem, default_tag: str) -> PlanItem:
    # An audit item with an empirical issue type is the integrated empirical signal E_t.
    tag = SPECIALISTS["empirical"].fail_tag if item.issue_type else default_tag
    return PlanItem(tag=tag, text=item.text, issue_type=item.issue_type)


def build_plan(
    audit: AuditReport | None,
    specialist: SpecialistReport | None,
    *,
    protect_audit: bool = True,
) -> RevisionPlan:
    """Build F and P from the audit quadrants and the specialist signal.

    `protect_audit=False` is the '- Structured Self-Audit (A+B)' ablation: Q_A and Q_B
    are dropped from P while the specialist's O_t is kept.
    """
    fix: list[PlanItem] = []
    protect: list[PlanItem] = []
    if audit is not None:
        fix += [_audit_fix_item(i, "MISSED") for i in audit.possibly_missed]
        fix += [_audit_fix_item(i, "WRONG") for i in audit.possibly_wrong]
        if protect_audit:
            protect += [PlanItem(tag="CONFIRMED-CORRECT", text=i.text) for i in audit.confirmed_correct]
            protect += [PlanItem(tag="CONFIRMED-DATA", text=i.text) for i in audit.confirmed_data]
    if specialist is not None:
        record = SPECIALISTS[specialist.kind]
        fix += [PlanItem(tag=record.fail_tag, text=t) for t in specialist.violations]
        protect += [PlanItem(tag=record.ok_tag, text=t) for t in specialist.satisfied]
    return RevisionPlan(fix_set=_union(fix), protect_set=_union(protect))


def render_items(items: list[PlanItem]) -> str:
    """The bullet list a revision prompt shows; '(none)' keeps the field non-empty."""
    return "\n".join(item.render() for item in items) or "(none)"


def render_numbered(items: list[PlanItem]) -> str:
    """The fix set as edit mode shows it: numbered, so each edit can name its item."""
    return "\n".join(f"{n}. {item.render().removeprefix('- ')}" for n, item in enumerate(items, start=1)) or "(none)"
