"""ContextGuard (paper Algorithm 1) as a dspy.Module.

    y0 = draft(C, q, Reminder(s, q))
    Q_A..Q_D = audit(C, q, y0)             O_t, E_t = specialist_t(C, q, y0)
    F = Q_C ∪ Q_D ∪ E_t                    P = Q_A ∪ Q_B ∪ O_t
    F empty -> y0;  y~ = revise(C, y0, F, P);  guard(y~, y0, P) passes -> y~ else y0

Every stage is its own predictor, so an optimizer tunes the audit and the revision
separately and a saved program holds each; an integrated specialist is an audit
predictor of its own (`audit_rules`, `audit_empirical`), its criteria part of its
instructions. A stage whose output does not parse never fails the task: the current
answer is kept and the reason is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

import dspy

from cg_dspy.core.messages import TASK_DELIMITER, Message
from cg_dspy.core.observe import span
from cg_dspy.lms.adapter import stage_messages
from cg_dspy.lms.replicas import one_task
from cg_dspy.method import specialists
from cg_dspy.method.edits import apply_edits
from cg_dspy.method.guard import MIN_LENGTH_RATIO, revision_guard
from cg_dspy.method.plan import build_plan, render_items, render_numbered
from cg_dspy.method.schemas import AuditReport, EditReport, GuardVerdict, RevisionPlan, SpecialistReport
from cg_dspy.method.signatures import Generate, ProtectedRevision, ReminderDraft, StructuredAudit, TargetedEdits
from cg_dspy.method.specialists import SPECIALISTS, SpecialistPolicy
from cg_dspy.method.stages import StageFailure, Stages

ABLATIONS = ("reminder", "audit", "protection", "specialists", "guard")
# chat: every stage after the draft continues the draft's chat (the answer as the
# assistant's turn, the stage as the next user turn), so a prefix-caching server
# prefills only the stage's own text; inline: the stage and the previous answer are
# appended to the task's final user message.
LAYOUTS = ("chat", "inline")
DEFAULT_LAYOUT = "chat"
MAX_ROUNDS = 5  # the paper uses 1; more rounds compound revision errors and cost
# rewrite: the paper's protected revision returns the whole answer (Prompt 7); edit: the
# revision returns targeted edits, applied by method.edits, so untouched text stays.
REVISION_MODES = ("rewrite", "edit")
REMINDER_REQUEST_CHARS = 1500


def reminder_request(request: str) -> str:
    """The request text a reminder repeats (Reminder(s, q)).

    A short request is repeated whole. A CLBench-life single-turn message is the context,
    `<|TASK|>`, then the task: the task is repeated, exactly the text after the (last)
    delimiter. Any other long final message usually carries the context itself with the
    question at its end, so only its tail is repeated rather than doubling the prompt.
    """
    if TASK_DELIMITER in request:
        return request.rpartition(TASK_DELIMITER)[2].strip()
    if len(request) <= REMINDER_REQUEST_CHARS:
        return request
    return "(end of the final user message) …" + request[-REMINDER_REQUEST_CHARS:]


def as_conversation(conversation) -> list[Message]:
    """Accept Messages or OpenAI-format dicts; the stages always see Messages."""
    return [m if isinstance(m, Message) else Message.model_validate(m) for m in conversation]


def check_layout(layout: str | None) -> str:
    """A layout name (None: the default)."""
    layout = DEFAULT_LAYOUT if layout is None else layout
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: choose from {LAYOUTS}")
    return layout


def continued(chat: list[Message], answer: str) -> list[Message]:
    """The draft's chat with `answer` as the assistant's turn: what a later stage continues."""
    return [*chat, Message(role="assistant", content=answer)]


def sent(predictor, conversation: list[Message], **inputs) -> list[Message]:
    """The messages a conversation stage sent (the chat its successors continue)."""
    signature = predictor.signature
    return as_conversation(stage_messages(signature, predictor.demos, {"conversation": conversation, **inputs}))


@dataclass
class Round:
    """One audit-and-revision round: what each stage produced, and how it ended."""

    audit: AuditReport | None = None
    specialist: SpecialistReport | None = None
    plan: RevisionPlan | None = None
    revision: str | None = None
    edits: EditReport | None = None  # edit mode: what each edit did
    verdict: GuardVerdict | None = None
    failed: str | None = None  # the stage whose output could not be used

    @property
    def accepted(self) -> bool:
        return self.verdict is not None and self.verdict.passed

    @property
    def outcome(self) -> str:
        if self.failed:
            return "stage-failed"
        if self.plan is not None and not self.plan.fix_set:
            return "early-return"
        if self.edits is not None and not self.edits.applied:
            return "no-edit"  # edit mode: no edit could be applied, the answer stands
        return "revised" if self.accepted else "rolled-back"


def path_of(rounds: list[Round]) -> str:
    """How the answer came about: "revised" when a revision was kept, else why the
    draft was: its first round's early return, roll-back or failed stage."""
    return "revised" if any(r.accepted for r in rounds) else rounds[0].outcome


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
        policy: specialists.Policy | None = None,
        min_length_ratio: float = MIN_LENGTH_RATIO,
        layout: str | None = None,
        revision_mode: str = "rewrite",
    ):
        super().__init__()
        unknown = set(ablate) - set(ABLATIONS)
        if unknown:
            raise ValueError(f"unknown ablation(s) {sorted(unknown)}; choose from {ABLATIONS}")
        if revision_mode not in REVISION_MODES:
            raise ValueError(f"revision mode {revision_mode!r}: choose from {REVISION_MODES}")
        if not 1 <= max_rounds <= MAX_ROUNDS:
            raise ValueError(f"max_rounds must be from 1 to {MAX_ROUNDS}, not {max_rounds}")
        self.ablate = tuple(sorted(set(ablate)))
        self.max_rounds = max_rounds
        self.policy = policy
        self.min_length_ratio = min_length_ratio
        self.layout = check_layout(layout)
        self.generate = dspy.Predict(Generate)
        self.draft = dspy.Predict(ReminderDraft)
        self.audit = dspy.Predict(StructuredAudit)
        for s in SPECIALISTS.values():
            setattr(self, s.audit_name, dspy.Predict(s.audit_signature()))
            setattr(self, s.checker_name, dspy.Predict(s.checker))
        # The revision stage the mode runs, and only that one: a rewrite program's state and
        # prompts are the paper's, and an edit program has no revision prompt it never sends.
        self.revision_mode = revision_mode
        if revision_mode == "rewrite":
            self.revise = dspy.Predict(ProtectedRevision)
        else:
            self.edit = dspy.Predict(TargetedEdits)

    def uses(self, component: str) -> bool:
        return component not in self.ablate

    def config(self) -> dict:
        """What rebuilds this program before its saved state is loaded (method.config)."""
        from cg_dspy.method.config import ProgramConfig

        return ProgramConfig("contextguard", self.ablate, self.max_rounds, self.min_length_ratio, self.policy,
                             self.layout, self.revision_mode).dump()

    # Optimizers tune what named_parameters() lists; `frozen` hides stages from them.
    frozen: frozenset[str] = frozenset()

    def named_parameters(self):
        return [(n, p) for n, p in super().named_parameters() if n not in self.frozen]

    def forward(self, conversation, category: str, draft: str | None = None) -> dspy.Prediction:
        """Run Algorithm 1. Pass `draft` to revise an existing draft (paired comparisons)."""
        with one_task():  # every stage on one replica when the LM has several
            return self._forward(conversation, category, draft)

    def _forward(self, conversation, category: str, draft: str | None) -> dspy.Prediction:
        conversation, stages = as_conversation(conversation), Stages()
        draft = self._draft(stages, conversation) if draft is None else draft
        chat = self._draft_chat(conversation)
        policy = specialists.resolve(category, self.policy, audit_enabled=self.uses("audit"))
        policy = policy if self.uses("specialists") else None
        answer, rounds = draft, []
        for _ in range(self.max_rounds):
            context = continued(chat, answer) if self.layout == "chat" else conversation
            rounds.append(self._round(stages, context, answer, policy))
            if not rounds[-1].accepted:
                break
            answer = rounds[-1].revision
        last = rounds[-1]
        edits = {"edits": last.edits} if self.revision_mode == "edit" else {}
        return dspy.Prediction(
            answer=answer, draft=draft, path=path_of(rounds), audit=last.audit, specialist=last.specialist,
            fix_set=last.plan.fix_set if last.plan else [], protect_set=last.plan.protect_set if last.plan else [],
            guard=last.verdict, **edits, rounds=rounds, failures=stages.failures, cost=stages.cost,
            structured_output=stages.structured_output)

    def _draft(self, stages: Stages, conversation) -> str:
        """y0, with the reminder of the system rules and final request (Prompt 1)."""
        if not self.uses("reminder"):
            return stages.run("draft", self.generate, conversation=conversation).answer
        return stages.run("draft", self.draft, conversation=conversation,
                          request=reminder_request(conversation[-1].content)).answer

    def _draft_chat(self, conversation) -> list[Message]:
        """The draft prompt as it was sent (also for a given draft: this program's own
        draft stage made it, or the baseline's plain generation when the reminder is off)."""
        if not self.uses("reminder"):
            return conversation
        return sent(self.draft, conversation, request=reminder_request(conversation[-1].content))

    def _round(self, stages: Stages, conversation, answer: str, policy: SpecialistPolicy | None) -> Round:
        """Audit, specialist signal, F and P, protected revision, guard: one round."""
        turn = Round()
        try:
            turn.audit = self._audit(stages, conversation, answer, policy)
        except StageFailure:
            turn.failed = "audit"
            return turn
        turn.specialist = self._specialist(stages, conversation, answer, policy)
        turn.plan = build_plan(turn.audit, turn.specialist, protect_audit=self.uses("protection"))
        if not turn.plan.fix_set:
            return turn
        try:
            turn.revision, turn.edits = self._revise(stages, conversation, answer, turn.plan)
        except StageFailure:
            turn.failed = "revise" if self.revision_mode == "rewrite" else "edit"
            return turn
        if turn.edits is not None and not turn.edits.applied:
            turn.revision = None
            return turn
        with span("guard") as watched:
            turn.verdict = (revision_guard(turn.revision, answer, turn.plan.protect_set, turn.plan.fix_set,
                                           min_length_ratio=self.min_length_ratio)
                            if self.uses("guard") else GuardVerdict(passed=True, reasons=["guard disabled"]))
            watched.set(passed=turn.verdict.passed, reasons=turn.verdict.reasons,
                        length_ratio=turn.verdict.length_ratio)
        return turn

    def _revise(self, stages: Stages, conversation, answer: str, plan: RevisionPlan) -> tuple[str, EditReport | None]:
        """The protected revision (Prompt 7) as a whole new answer; in edit mode, the
        answer with the targeted edits applied (and what became of each edit)."""
        if self.revision_mode == "rewrite":
            return stages.run("revise", self.revise, conversation=conversation, previous_answer=answer,
                              fix_set=render_items(plan.fix_set),
                              protect_set=render_items(plan.protect_set)).revised_answer, None
        out = stages.run("edit", self.edit, conversation=conversation, previous_answer=answer,
                         fix_set=render_numbered(plan.fix_set), protect_set=render_items(plan.protect_set))
        return apply_edits(answer, out.edits or [], fix_set=plan.fix_set, protect_set=plan.protect_set,
                           truncated=stages.cut.get("edit", False))

    def _audit(self, stages: Stages, conversation, answer, policy) -> AuditReport | None:
        """Q_A..Q_D; an integrated specialist's criteria are part of its own audit predictor."""
        if not self.uses("audit"):
            return None
        integrated = policy is not None and policy.mode == "integrated"
        predictor = getattr(self, SPECIALISTS[policy.kind].audit_name) if integrated else self.audit
        out = stages.run("audit", predictor, conversation=conversation, previous_answer=answer)
        return AuditReport(confirmed_correct=out.confirmed_correct or [], confirmed_data=out.confirmed_data or [],
                           possibly_missed=out.possibly_missed or [], possibly_wrong=out.possibly_wrong or [])

    def _specialist(self, stages: Stages, conversation, answer, policy) -> SpecialistReport | None:
        """O_t, E_t from a separate checker call; integrated criteria already ran in the audit."""
        if policy is None or policy.mode != "separate":
            return None
        record = SPECIALISTS[policy.kind]
        try:
            out = stages.run(record.checker_name, getattr(self, record.checker_name), conversation=conversation,
                             previous_answer=answer)
        except StageFailure:
            return None  # recorded in stages.failures; the audit's F and P still stand
        return SpecialistReport(kind=policy.kind, satisfied=getattr(out, record.satisfied) or [],
                                violations=getattr(out, record.violations) or [])
