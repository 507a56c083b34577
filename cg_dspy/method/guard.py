"""Revision guard (paper Appendix D): detect destructive edits, not grade the answer.

Pure Python. The revision is rejected, and the draft kept, when any of three checks fires:
excessive shortening, loss of protected concrete content, or structural degradation that
no fix item asked for.
"""

from __future__ import annotations

import json
import re

from cg_dspy.method.schemas import GuardVerdict, PlanItem
from cg_dspy.method.specialists import SPECIALISTS

MIN_LENGTH_RATIO = 0.5

_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?%?")
_QUOTED = re.compile(r"\"([^\"\n]{2,120})\"|“([^”\n]{2,120})”|'([^'\n]{3,120})'")
_LABEL = re.compile(r"(?m)(?:^#{1,6}\s*([^\n]{2,80})$|\b([A-Z][\w\- ]{1,40}):)")
_FORMAT_WORDS = re.compile(
    r"format|structure|json|table|list|bullet|heading|section|layout|order|number(ed|ing)",
    re.IGNORECASE,
)


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def concrete_content(text: str) -> set[str]:
    """Numbers, quoted strings, headings and labels named in a protected item."""
    found = {m.group(0).rstrip(",") for m in _NUMBER.finditer(text)}
    found |= {next(g for g in m.groups() if g) for m in _QUOTED.finditer(text)}
    found |= {next(g for g in m.groups() if g) for m in _LABEL.finditer(text)}
    return {_norm(f) for f in found if _norm(f)}


def protected_loss(before: str, after: str, protect_set: list[PlanItem],
                   fix_set: list[PlanItem] = ()) -> list[tuple[str, list[str]]]:
    """(tag, pieces) for each protection item whose concrete content is in `before` and
    not in `after`, leaving out what a fix item names (that is asked to change)."""
    before_n, after_n = _norm(before), _norm(after)
    targeted = " ".join(_norm(i.text) for i in fix_set)
    found = []
    for item in protect_set:
        lost = sorted(piece for piece in concrete_content(item.text)
                      if _holds(before_n, piece) and not _holds(after_n, piece) and not _holds(targeted, piece))
        if lost:
            found.append((item.tag, lost))
    return found


def _holds(text: str, piece: str) -> bool:
    """`piece` in `text`; a number only as a whole number ("2" is not in "20" or "1.25")."""
    if _NUMBER.fullmatch(piece):
        return re.search(rf"(?<![\w.]){re.escape(piece)}(?!\w|\.\d)", text) is not None
    return piece in text


def structure_of(text: str) -> dict[str, int]:
    """Counts of the structures a required format usually takes."""
    lines = [line.strip() for line in text.splitlines()]
    return {
        "json": int(_is_json(text)),
        "table": sum(1 for line in lines if line.startswith("|") and line.count("|") >= 2),
        "list": sum(1 for line in lines if re.match(r"^([-*•]|\d+[.)])\s+\S", line)),
        "sections": sum(1 for line in lines if re.match(r"^(#{1,6}\s+\S|\*\*[^*]+\*\*:?$)", line)),
    }


def _is_json(text: str) -> bool:
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, re.DOTALL)
    body = fenced.group(1) if fenced else body
    if not body or body[0] not in "[{":
        return False
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def _asks_for_format_change(fix_set: list[PlanItem]) -> bool:
    return any(i.tag == SPECIALISTS["format"].fail_tag or _FORMAT_WORDS.search(i.text) for i in fix_set)


def revision_guard(
    revised: str,
    draft: str,
    protect_set: list[PlanItem],
    fix_set: list[PlanItem] = (),
    *,
    min_length_ratio: float = MIN_LENGTH_RATIO,
) -> GuardVerdict:
    """Pass or roll back a revision; every triggered condition is listed in `reasons`."""
    reasons: list[str] = []
    draft_len = len(_norm(draft))
    ratio = len(_norm(revised)) / draft_len if draft_len else 1.0
    if ratio < min_length_ratio:
        reasons.append(f"excessive shortening: length ratio {ratio:.2f} < {min_length_ratio:.2f}")

    for tag, lost in protected_loss(draft, revised, protect_set, fix_set):
        reasons.append(f"protected content lost from [{tag}]: {', '.join(lost)}")

    if not _asks_for_format_change(list(fix_set)):
        before, after = structure_of(draft), structure_of(revised)
        if before["json"] and not after["json"]:
            reasons.append("structural degradation: the draft is valid JSON, the revision is not")
        for kind in ("table", "list", "sections"):
            if before[kind] >= 2 and after[kind] < before[kind] / 2:
                reasons.append(
                    f"structural degradation: {kind} collapsed from {before[kind]} to {after[kind]} lines"
                )
    return GuardVerdict(passed=not reasons, reasons=reasons, length_ratio=round(ratio, 4))
