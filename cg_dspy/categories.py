"""Category policy (paper Table 7, §3.4): which specialist signal a category gets, and
whether it runs as a separate checker call or as criteria integrated into the audit.

The defaults follow the paper: format and procedure signals are explicit structural
checks, so they are separate calls; rule fidelity and empirical consistency are tied to
the reasoning itself, so they are folded into the structured self-audit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cg_dspy.schemas import SpecialistKind

Mode = Literal["separate", "integrated"]
KINDS = ("format", "procedure", "rules", "empirical")


@dataclass(frozen=True)
class SpecialistPolicy:
    kind: SpecialistKind
    mode: Mode


DEFAULT_POLICY: dict[str, SpecialistPolicy] = {
    "Domain Knowledge Reasoning": SpecialistPolicy("format", "separate"),
    "Procedural Task Execution": SpecialistPolicy("procedure", "separate"),
    "Rule System Application": SpecialistPolicy("rules", "integrated"),
    "Empirical Discovery & Simulation": SpecialistPolicy("empirical", "integrated"),
}

# Criteria added to the audit when a specialist is integrated (Prompts 5 and 6).
INTEGRATED_CRITERIA: dict[str, str] = {
    "rules": (
        "This task depends on faithfully applying the provided rulebook. Also check: exact "
        "rule definitions and terminology; exceptions and boundary conditions; numerical or "
        "symbolic conditions; required decision procedures; invented rules the context does "
        "not support; rules applied too strictly or too loosely."
    ),
    "empirical": (
        "This is an empirical discovery or simulation task. Also check that the answer is "
        "grounded in the provided data, observations or simulation rules: numerical "
        "correctness, unit consistency, comparison completeness, trend interpretation, "
        "coverage of every requested condition, evidence for each empirical claim, and no "
        "over-generalisation beyond the data. Give every possibly-missed or possibly-wrong "
        "item an issue_type: numeric, comparison, coverage, unit, trend or evidence."
    ),
    "format": (
        "Also check every format, structure and presentation rule of the conversation: "
        "structure, ordering, labels and headings, typography, length and forbidden content."
    ),
    "procedure": (
        "Also check the workflow: step order, agent routing and hand-offs, dependencies, gate "
        "checks and thresholds, timing, logging, and safety, refusal or escalation rules."
    ),
}


def resolve(
    category: str,
    policy: dict[str, SpecialistPolicy] | None = None,
    *,
    audit_enabled: bool = True,
) -> SpecialistPolicy | None:
    """The specialist for a category, or None when the category has none.

    Without an audit there is nothing to integrate into, so an integrated specialist
    runs as a separate checker instead (the '- Structured Self-Audit' ablation).
    """
    chosen = (policy or DEFAULT_POLICY).get(category)
    if chosen is None:
        return None
    if chosen.mode == "integrated" and not audit_enabled:
        return SpecialistPolicy(chosen.kind, "separate")
    return chosen
