"""Edit-mode revision: targeted edits applied to the answer deterministically; pure, no
LM, no I/O.

An edit replaces an exact passage of the answer, inserts after an exact anchor, or
appends. Its passage or anchor must occur exactly once in the answer it edits, every
edit is located in that same answer, and an edit that would overlap one kept before it
is dropped, so the text outside the edited passages is the answer's own, byte for byte.
An edit must name its fix-set item. An edit that would delete or change content a
protection item names is refused, matched as the revision guard matches it: the item's
concrete content (numbers, quoted strings, headings and labels) present in the answer
and missing once this edit alone is applied, unless a fix item names it too (so a
passage holding a protected "2" may change when the "2" stays elsewhere, and an
insertion that splits a protected phrase is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from cg_dspy.method.guard import protected_loss
from cg_dspy.method.schemas import DroppedEdit, Edit, EditReport, PlanItem

CUT = "the edit list was cut at max_tokens here"


@dataclass(frozen=True)
class _Span:
    number: int
    start: int  # what the edit covers in the answer: a passage, or an anchor
    end: int
    at: int  # where its text goes
    edit: Edit


def apply_edits(answer: str, edits: list[Edit], *, fix_set: list[PlanItem], protect_set: list[PlanItem] = (),
                truncated: bool = False) -> tuple[str, EditReport]:
    """The answer with the usable edits applied, and what happened to each edit. When the
    reply was cut at max_tokens its last edit is dropped: it may be cut mid-text."""
    report = EditReport(edits=list(edits))
    kept: list[_Span] = []
    for number, edit in enumerate(edits, start=1):
        if truncated and number == len(edits):
            reason = CUT
        else:
            located = _locate(answer, number, edit, len(fix_set))
            if isinstance(located, str):
                reason = located
            else:
                reason = _overlap(located, kept) or _protected(answer, located, protect_set, fix_set)
                if not reason:
                    kept.append(located)
                    continue
        report.dropped.append(DroppedEdit(edit=number, reason=reason))
    text = _compose(answer, kept)
    if kept and not text.strip():
        report.dropped += [DroppedEdit(edit=s.number, reason="together the edits would empty the answer")
                           for s in kept]
        report.dropped.sort(key=lambda d: d.edit)
        return answer, report
    report.applied = sorted(s.number for s in kept)
    return text, report


def _locate(answer: str, number: int, edit: Edit, fix_count: int) -> _Span | str:
    """Where an edit goes, or why it cannot."""
    if edit.action is None:
        return "no action (replace, insert_after or append)"
    if edit.fix_item is None or not 1 <= edit.fix_item <= fix_count:
        return f"names no fix-set item (fix_item {edit.fix_item}; the fix set has {fix_count})"
    if edit.action == "append":
        if not (edit.text or "").strip():
            return "appends nothing"
        return _Span(number, len(answer), len(answer), len(answer), edit)
    what = "passage" if edit.action == "replace" else "anchor"
    if not edit.target:
        return f"no {what} given"
    if edit.text is None:
        return "no text given (an empty text deletes the passage)" if what == "passage" else "inserts nothing"
    found = answer.count(edit.target)
    if found != 1:
        return f"the {what} is {'not in the answer' if not found else f'in the answer {found} times'}"
    start = answer.index(edit.target)
    end = start + len(edit.target)
    if edit.action == "replace":
        if edit.text == edit.target:
            return "replaces the passage with itself"
        return _Span(number, start, end, start, edit)
    if not edit.text.strip():
        return "inserts nothing"
    return _Span(number, start, end, end, edit)


def _overlap(span: _Span, kept: list[_Span]) -> str:
    """An edit touching text an earlier kept edit covers (appends touch nothing)."""
    if span.edit.action == "append":
        return ""
    for other in kept:
        if other.edit.action != "append" and span.start < other.end and other.start < span.end:
            return f"overlaps edit {other.number}"
    return ""


def _protected(answer: str, span: _Span, protect_set: list[PlanItem], fix_set: list[PlanItem]) -> str:
    """An edit that, applied alone, would delete or change what a protection item names."""
    lost = protected_loss(answer, _compose(answer, [span]), protect_set, fix_set)
    return "; ".join(f"would change protected content [{tag}]: {', '.join(pieces)}" for tag, pieces in lost)


def _compose(answer: str, kept: list[_Span]) -> str:
    """The answer with each kept edit in place; insertions and appends get a separator
    when neither side has white space (a space after an anchor, a blank line at the end)."""
    out, cursor = [], 0
    # At one point an insertion after an anchor comes before a replacement that starts there.
    placed = sorted((s for s in kept if s.edit.action != "append"),
                    key=lambda s: (s.at, s.edit.action == "replace", s.number))
    for span in placed:
        if span.edit.action == "replace":
            out += [answer[cursor:span.start], span.edit.text]
            cursor = span.end
        else:
            out += [answer[cursor:span.at], _joined(answer[:span.at], span.edit.text, " ")]
            cursor = span.at
    out.append(answer[cursor:])
    text = "".join(out)
    for span in (s for s in kept if s.edit.action == "append"):
        text += _joined(text, span.edit.text, "\n\n")
    return text


def _joined(before: str, text: str, separator: str) -> str:
    if before and text and not before[-1].isspace() and not text[0].isspace():
        return separator + text
    return text
