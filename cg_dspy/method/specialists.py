"""Category-conditioned specialist signals (paper §3.4, Table 7, Prompts 3-6).

One record per kind holds everything about it: the separate checker (its signature and
its O_t / E_t output fields), the tags its items carry in the fix and protection sets,
the criteria an audit takes on when the signal is integrated, and the CL-bench category
it serves by default and how. Adding a kind is one entry in `SPECIALISTS`.

The default policy follows the paper: format and procedure signals are explicit
structural checks, so they run as separate checker calls; rule fidelity and empirical
consistency are tied to the reasoning itself, so they are folded into the structured
self-audit, as that audit predictor's own instructions (tunable like any other).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import dspy

from cg_dspy.method.signatures import EmpiricalCheck, FormatCheck, ProcedureCheck, RulesCheck, StructuredAudit

Mode = Literal["separate", "integrated"]


@dataclass(frozen=True)
class Specialist:
    """Everything about one specialist signal."""

    kind: str
    checker: type[dspy.Signature]  # the separate checker
    satisfied: str  # the checker's O_t output field
    violations: str  # the checker's E_t output field
    ok_tag: str  # protection-set tag of O_t items
    fail_tag: str  # fix-set tag of E_t items
    criteria: str  # what an audit also checks when the signal is integrated
    category: str  # the CL-bench category it serves by default
    mode: Mode  # how it runs for that category by default

    @property
    def checker_name(self) -> str:
        """The program's predictor for the separate checker."""
        return f"{self.kind}_check"

    @property
    def audit_name(self) -> str:
        """The program's audit predictor with these criteria integrated."""
        return f"audit_{self.kind}"

    def audit_signature(self) -> type[dspy.Signature]:
        """The structured self-audit with the criteria as part of its instructions."""
        return StructuredAudit.with_instructions(f"{StructuredAudit.instructions.strip()}\n\n{self.criteria}")


SPECIALISTS: dict[str, Specialist] = {s.kind: s for s in (
    Specialist(
        "format", FormatCheck, "format_ok", "format_fail", "FORMAT-OK", "FORMAT-FAIL",
        "Also check every format, structure and presentation rule of the conversation: structure, ordering, "
        "labels and headings, typography, length and forbidden content.",
        "Domain Knowledge Reasoning", "separate"),
    Specialist(
        "procedure", ProcedureCheck, "proc_ok", "proc_fail", "PROC-OK", "PROC-FAIL",
        "Also check the workflow: step order, agent routing and hand-offs, dependencies, gate checks and "
        "thresholds, timing, logging, and safety, refusal or escalation rules.",
        "Procedural Task Execution", "separate"),
    Specialist(
        "rules", RulesCheck, "rules_ok", "rules_fail", "RULES-OK", "RULES-FAIL",
        "This task depends on faithfully applying the provided rulebook. Also check: exact rule definitions "
        "and terminology; exceptions and boundary conditions; numerical or symbolic conditions; required "
        "decision procedures; invented rules the context does not support; rules applied too strictly or too "
        "loosely.",
        "Rule System Application", "integrated"),
    Specialist(
        "empirical", EmpiricalCheck, "empirical_ok", "empirical_issues", "EMPIRICAL-OK", "EMPIRICAL-ISSUE",
        "This is an empirical discovery or simulation task. Also check that the answer is grounded in the "
        "provided data, observations or simulation rules: numerical correctness, unit consistency, comparison "
        "completeness, trend interpretation, coverage of every requested condition, evidence for each empirical "
        "claim, and no over-generalisation beyond the data. Give every possibly-missed or possibly-wrong item an "
        "issue_type: numeric, comparison, coverage, unit, trend or evidence.",
        "Empirical Discovery & Simulation", "integrated"),
)}
KINDS = tuple(SPECIALISTS)
MODES: tuple[Mode, ...] = ("separate", "integrated")


@dataclass(frozen=True)
class SpecialistPolicy:
    kind: str
    mode: Mode


# A category maps to its specialist, or to None: the generic audit with no specialist.
Policy = dict[str, "SpecialistPolicy | None"]

DEFAULT_POLICY: Policy = {s.category: SpecialistPolicy(s.kind, s.mode) for s in SPECIALISTS.values()}
# A category the paper did not study (CLBench-life's three, any other) runs the generic
# structured self-audit and no specialist: the four signals were chosen and measured for
# CL-bench's four categories, the generic audit already covers what a task misses or
# gets wrong, and a specialist that was never validated there would cost a call per
# task without evidence that it helps. `--policy FILE` assigns one where you have it.


def parse_policy(policy: object, where: str) -> Policy:
    """A policy from JSON: category -> [kind, mode], {"kind": ..., "mode": ...}, or null
    (no specialist). Raises ValueError naming the entry."""
    if not isinstance(policy, dict):
        raise ValueError(f"{where}: a policy is an object of category -> [kind, mode] (or null for none)")
    parsed: Policy = {}
    for category, entry in policy.items():
        if isinstance(entry, dict) and set(entry) == {"kind", "mode"}:
            entry = [entry["kind"], entry["mode"]]
        if not isinstance(category, str) or not category.strip():
            raise ValueError(f"{where}: {category!r} is not a category name")
        if entry is None:
            parsed[category] = None
        elif isinstance(entry, list) and len(entry) == 2 and entry[0] in KINDS and entry[1] in MODES:
            parsed[category] = SpecialistPolicy(*entry)
        else:
            raise ValueError(f"{where}[{category!r}]: {entry!r}; write [kind, mode] with kind in {list(KINDS)} and "
                             f"mode in {list(MODES)}, or null for no specialist")
    return parsed


def dump_policy(policy: Policy) -> dict[str, list[str] | None]:
    """The JSON form `parse_policy` reads."""
    return {c: [p.kind, p.mode] if p else None for c, p in policy.items()}


def resolve(
    category: str,
    policy: Policy | None = None,
    *,
    audit_enabled: bool = True,
) -> SpecialistPolicy | None:
    """The specialist for a category, or None when the category has none (a category
    the policy does not name has none).

    Without an audit there is nothing to integrate into, so an integrated specialist
    runs as a separate checker instead (the '- Structured Self-Audit' ablation).
    """
    chosen = (DEFAULT_POLICY if policy is None else policy).get(category)
    if chosen is None:
        return None
    if chosen.mode == "integrated" and not audit_enabled:
        return SpecialistPolicy(chosen.kind, "separate")
    return chosen


def integrated_audits(policy: Policy | None = None) -> list[str]:
    """The audit predictors a policy runs for integrated specialists."""
    chosen = DEFAULT_POLICY if policy is None else policy
    return [SPECIALISTS[p.kind].audit_name for p in chosen.values() if p is not None and p.mode == "integrated"]
