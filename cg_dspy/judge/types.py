"""Table 2's five requirement types, and the keyword typer that assigns them offline.

Pure (no LM, no DSPy): the report's Table 2, the trace writer naming each verdict by its
type, and the judge's typer signature all read it. The LM typer (`typer.LMTyper`) is
the other way to type a rubric.
"""

from __future__ import annotations

import re
from functools import lru_cache

RUBRIC_TYPES = (
    "format/lexical",
    "procedure/agent",
    "calc/verify/standards",
    "conditional rules",
    "style/audience/persona",
)
OTHER = "other"  # a rubric no type fits

# Keyword cues per requirement type; a rubric takes the type with the most cues
# (ties go to the earlier type), and a rubric with no cue is left untyped. Agreement with
# hand labels of 67 real CL-bench rubrics: tests/test_rubric_types.py (and the README).
_TYPE_CUES = {
    "format/lexical": r"format|bullet|numbered|list\b|listed|table|json|xml|heading|section|paragraph|bold|italic|"
    r"markdown|words?\b|characters?|sentence|begin|start with|end with|ends? with|conclude with|capital|"
    r"quote|exactly|phrase|label|length|\blines?\b|glossary|disclaimer|unique .*terms|order the|citations?",
    "procedure/agent": r"step|procedure|workflow|route|routing|agent|hand-?off|escalat|\blog\b|logs|"
    r"sequence|gate|checklist|protocol|stop and|before|after|then\b|follow-?up|continu|"
    r"confirm the user",
    "calc/verify/standards": r"calculat|compute|total|sum\b|average|mean\b|percent|%|estimate|\bunits?\b|"
    r"verif|standard|formula|value|accura|precis|quantitativ|mathemat|numer|evidence|supported by|"
    r"\bdata\b|principle|specification|exact text|unable to find|distinguish",
    "conditional rules": r"\bif\b|unless|except|\bwhen\b|only if|rule|condition|exempt|appl(y|ies)|"
    r"threshold|not approved|must not|never|eligib",
    "style/audience/persona": r"tone|style|audience|persona|friendly|formal|plain language|slang|"
    r"empath|polite|voice|\brole\b|teenager|beginner|child|warm|encourag|concise|emoji|euphemis|analog|"
    r"everyday language|accessible|sound confident|sadness|acknowledge|\bAI\b|advanced knowledge|"
    r"you are an? |simple to complex|assistant that",
}
# Matched against the lowercased rubric: four times faster than re.IGNORECASE, which a
# paper-sized report (45,000 rubrics per method) felt as seconds.
_CUE_RE = {t: re.compile(p.lower()) for t, p in _TYPE_CUES.items()}


@lru_cache(maxsize=65536)
def rubric_type(rubric: str) -> str | None:
    """The requirement type a rubric tests, by keyword cues (None when no cue matches).
    Cached: every method's file of a comparison carries the same rubrics."""
    rubric = rubric.lower()
    hits = {t: len(_CUE_RE[t].findall(rubric)) for t in RUBRIC_TYPES}
    best = max(RUBRIC_TYPES, key=lambda t: hits[t])
    return best if hits[best] else None
