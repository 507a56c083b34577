"""ContextGuard (paper Algorithm 1) as a dspy.Module.

    y0 = draft(C, q, Reminder(s, q))
    Q_A..Q_D = audit(C, q, y0)             O_t, E_t = specialist_t(C, q, y0)
    F = Q_C ∪ Q_D ∪ E_t                    P = Q_A ∪ Q_B ∪ O_t
    F empty -> y0;  y~ = revise(C, y0, F, P);  guard(y~, y0, P) passes -> y~ else y0

Every stage is its own predictor, so an optimizer tunes the audit and the revision
separately and a saved program holds each. A stage whose output does not parse never
fails the task: the current answer is kept and the reason is recorded.
"""

from __future__ import annotations

import dspy

from cg_dspy import categories
from cg_dspy.guard import MIN_LENGTH_RATIO, revision_guard
from cg_dspy.plan import build_plan, render_items
from cg_dspy.schemas import AuditReport, GuardVerdict, Message, SpecialistReport
from cg_dspy.signatures import (
    EmpiricalCheck,
    FormatCheck,
    Generate,
    ProcedureCheck,
    ProtectedRevision,
    ReminderDraft,
    RulesCheck,
    StructuredAudit,
)
from cg_dspy.stages import StageFailure, Stages

ABLATIONS = ("reminder", "audit", "protection", "specialists", "guard")
MAX_ROUNDS = 5  # the paper uses 1; more rounds compound revision errors and cost

# specialist kind -> (predictor attribute, satisfied field, violations field)
CHECKERS = {
    "format": ("format_check", "format_ok", "format_fail"),
    "procedure": ("procedure_check", "proc_ok", "proc_fail"),
    "rules": ("rules_check", "rules_ok", "rules_fail"),
    "empirical": ("empirical_check", "empirical_ok", "empirical_issues"),
}


REMINDER_REQUEST_CHARS = 1500


def reminder_request(request: str) -> str:
    """The request text a reminder repeats (Reminder(s, q)).

    A short request is repeated whole. A long final message usually carries the
    context itself with the question at its end, so only its tail is repeated rather
    than doubling the prompt.
    """
    if len(request) <= REMINDER_REQUEST_CHARS:
        return request
    return "(end of the final user message) …" + request[-REMINDER_REQUEST_CHARS:]


def as_conversation(conversation) -> list[Message]:
    """Accept Messages or OpenAI-format dicts; the stages always see Messages."""
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in conversation]


class SavesConfig:
    """Saved state carries the class's `config()`, so a loader rebuilds the right program."""

    def dump_state(self, *args, **kwargs):
        return {**super().dump_state(*args, **kwargs), "cg_dspy": self.config()}


class ContextGuard(SavesConfig, dspy.Module):
    """Reminder draft, structured self-audit, specialist signal, protected revision, guard.

    `ablate` removes components as in the paper's Table 3: "reminder" (plain draft),
    "audit" (no structured self-audit), "protection" (Q_A and Q_B left out of P),
    "specialists" (no specialist signal), "guard" (every revision accepted).
    """

    def __init__(
        self,
        *,
        ablate: tuple[str, ...] | list[str] = (),
        max_rounds: int = 1,
        policy: dict[str, categories.SpecialistPolicy] | None = None,
        min_length_ratio: float = MIN_LENGTH_RATIO,
    ):
        super().__init__()
        unknown = set(ablate) - set(ABLATIONS)
        if unknown:
            raise ValueError(f"unknown ablation(s) {sorted(unknown)}; choose from {ABLATIONS}")
        if not 1 <= max_rounds <= MAX_ROUNDS:
            raise ValueError(f"max_rounds must be from 1 to {MAX_ROUNDS}, not {max_rounds}")
        self.ablate = tuple(sorted(set(ablate)))
        self.max_rounds = max_rounds
        self.policy = policy
        self.min_length_ratio = min_length_ratio
        self.generate = dspy.Predict(Generate)
        self.draft = dspy.Predict(ReminderDraft)
        self.audit = dspy.Predict(StructuredAudit)
        self.format_check = dspy.Predict(FormatCheck)
        self.procedure_check = dspy.Predict(ProcedureCheck)
        self.rules_check = dspy.Predict(RulesCheck)
        self.empirical_check = dspy.Predict(EmpiricalCheck)
        self.revise = dspy.Predict(ProtectedRevision)

    def uses(self, component: str) -> bool:
        return component not in self.ablate

    def config(self) -> dict:
        """What rebuilds this program before its saved state is loaded."""
        policy = {c: [p.kind, p.mode] for c, p in self.policy.items()} if self.policy else None
        return {"method": "contextguard", "ablate": list(self.ablate), "max_rounds": self.max_rounds,
                "min_length_ratio": self.min_length_ratio, "policy": policy}

    # Optimizers tune what named_parameters() lists; `frozen` hides stages from them.
    frozen: frozenset[str] = frozenset()

    def named_parameters(self):
        return [(n, p) for n, p in super().named_parameters() if n not in self.frozen]

    def forward(self, conversation, category: str, draft: str | None = None) -> dspy.Prediction:
        """Run Algorithm 1. Pass `draft` to revise an existing draft (paired comparisons)."""
        conversation = as_conversation(conversation)
        stages = Stages()
        if draft is None:
            if self.uses("reminder"):
                draft = stages.run(
                    "draft",
                    self.draft,
                    conversation=conversation,
                    request=reminder_request(conversation[-1].content),
                ).answer
            else:
                draft = stages.run("draft", self.generate, conversation=conversation).answer
        policy = categories.resolve(category, self.policy, audit_enabled=self.uses("audit"))
        if not self.uses("specialists"):
            policy = None

        answer, path, rounds = draft, "early-return", []
        for _ in range(self.max_rounds):
            record: dict = {}
            rounds.append(record)
            try:
                record["audit"] = self._audit(stages, conversation, answer, policy)
            except StageFailure:
                path = "stage-failed"
                break
            record["specialist"] = self._specialist(stages, conversation, answer, policy)
            plan = build_plan(record["audit"], record["specialist"], protect_audit=self.uses("protection"))
            record["plan"] = plan
            if not plan.fix_set:
                path = "early-return" if len(rounds) == 1 else path
                break
            try:
                revised = stages.run(
                    "revise",
                    self.revise,
                    conversation=conversation,
                    previous_answer=answer,
                    fix_set=render_items(plan.fix_set),
                    protect_set=render_items(plan.protect_set),
                ).revised_answer
            except StageFailure:
                path = "stage-failed"
                break
            record["revised"] = revised
            if self.uses("guard"):
                verdict = revision_guard(
                    revised, answer, plan.protect_set, plan.fix_set, min_length_ratio=self.min_length_ratio
                )
            else:
                verdict = GuardVerdict(passed=True, reasons=["guard disabled"])
            record["guard"] = verdict
            if not verdict.passed:
                path = "rolled-back"
                break
            answer, path = revised, "revised"

        last = rounds[-1] if rounds else {}
        plan = last.get("plan")
        return dspy.Prediction(
            answer=answer,
            draft=draft,
            audit=last.get("audit"),
            specialist=last.get("specialist"),
            fix_set=plan.fix_set if plan else [],
            protect_set=plan.protect_set if plan else [],
            guard=last.get("guard"),
            path=path,
            rounds=rounds,
            failures=stages.failures,
            cost=stages.cost,
            structured_output=stages.structured_output,
        )

    def _audit(self, stages: Stages, conversation, answer, policy) -> AuditReport | None:
        if not self.uses("audit"):
            return None
        integrated = policy is not None and policy.mode == "integrated"
        criteria = categories.INTEGRATED_CRITERIA[policy.kind] if integrated else "none"
        out = stages.run(
            "audit",
            self.audit,
            conversation=conversation,
            previous_answer=answer,
            criteria=criteria,
        )
        return AuditReport(
            confirmed_correct=out.confirmed_correct or [],
            confirmed_data=out.confirmed_data or [],
            possibly_missed=out.possibly_missed or [],
            possibly_wrong=out.possibly_wrong or [],
        )

    def _specialist(self, stages: Stages, conversation, answer, policy) -> SpecialistReport | None:
        """A separate checker call; integrated criteria already ran inside the audit."""
        if policy is None or policy.mode != "separate":
            return None
        attr, ok_field, fail_field = CHECKERS[policy.kind]
        try:
            out = stages.run(policy.kind, getattr(self, attr), conversation=conversation, previous_answer=answer)
        except StageFailure:
            return None  # recorded in stages.failures; the audit's F and P still stand
        return SpecialistReport(
            kind=policy.kind, satisfied=getattr(out, ok_field) or [], violations=getattr(out, fail_field) or []
        )
