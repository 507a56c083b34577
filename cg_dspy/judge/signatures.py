"""The judge's prompts as dspy.Signatures: one requirement at a time (the paper's Prompt
8), every requirement at once (CL-bench's official protocol), and the requirement typer
(Table 2's five types). Each docstring is the instruction; a saved judge or typer would
hold it as a ContextGuard stage does.
"""

from __future__ import annotations

from typing import Annotated, Literal

import dspy
from pydantic import BeforeValidator


def _label(value: object) -> object:
    """A judge's yes/no as servers that ignore the schema write it ("Yes.", "YES", "y",
    true); anything else stays as it is and fails, so the vote is asked again."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        word = value.strip().strip("\"'`*.!").strip().lower()
        return {"y": "yes", "yes": "yes", "true": "yes", "n": "no", "no": "no", "false": "no"}.get(word, value)
    return value


JudgeLabel = Annotated[Literal["yes", "no"], BeforeValidator(_label)]


class JudgeRequirement(dspy.Signature):
    """You are a rigorous instruction-following grading teacher. Grade the student
    response against one specific requirement. Answer "yes" only if the response
    clearly satisfies the requirement; otherwise answer "no"."""

    response: str = dspy.InputField(desc="The student response to grade.")
    requirement: str = dspy.InputField(desc="The one requirement to check.")
    reason: str = dspy.OutputField(desc="A brief explanation of the decision.")
    satisfaction_status: JudgeLabel = dspy.OutputField(desc="yes or no.")


class RequirementType(dspy.Signature):
    """Classify what one requirement of a context-learning task mainly tests, into one of
    five types (or "other"):
    - format/lexical: output structure and surface form (a required format such as JSON,
      a table, list, headings or sections; length and word limits; the number or order of
      presented items; exact phrases, labels or terms to use or avoid; citation markup).
    - procedure/agent: workflow and coordination (steps in order, agent roles, hand-offs,
      routing and escalation, timing, gate checks, what to do before or after, logging).
    - calc/verify/standards: calculation and verification (numeric correctness, derived or
      computed results, quantitative relationships, checking claims against the data,
      evidence or a technical standard).
    - conditional rules: applying the context's rules with their conditions and exceptions
      (if / unless / only when, applicability, eligibility, prohibitions a rule sets).
    - style/audience/persona: tone, register, audience fit, persona or role voice, empathy,
      politeness, reading level.
    - other: none of these (a plain statement of content).
    Choose the single type the requirement is mainly about."""

    requirement: str = dspy.InputField(desc="One requirement of a task's rubric.")
    requirement_type: Literal["format/lexical", "procedure/agent", "calc/verify/standards", "conditional rules",
                              "style/audience/persona", "other"] = dspy.OutputField()


class JudgeAllRubrics(dspy.Signature):
    """You are a rigorous instruction-following grading teacher. Grade the student
    response against every requirement in the numbered list, in order. A requirement
    gets "yes" only if the response clearly satisfies it; otherwise "no"."""

    response: str = dspy.InputField(desc="The student response to grade.")
    rubrics: str = dspy.InputField(desc="The numbered requirements.")
    grading_rationale: str = dspy.OutputField(desc="A brief check of each requirement.")
    requirement_status: list[JudgeLabel] = dspy.OutputField(
        desc="One yes/no per requirement, in the given order."
    )
