"""The paper's baselines, built on the same draft so comparisons are paired.

`Baseline` is one plain generation. `SelfRefine` takes that same draft (the `generate`
predictor has the same signature and prompt, so a cached run reuses it, or pass
`draft=` explicitly), asks for free-form feedback and revises without constraints.
"""

from __future__ import annotations

import dspy

from cg_dspy.lms.replicas import one_task
from cg_dspy.method.program import SavesConfig, as_conversation, check_layout, continued
from cg_dspy.method.signatures import Generate, SelfFeedback, SelfRefineRevision
from cg_dspy.method.stages import StageFailure, Stages


class Baseline(SavesConfig, dspy.Module):
    """One generation from the conversation, no reminder, no revision."""

    def __init__(self):
        super().__init__()
        self.generate = dspy.Predict(Generate)

    def config(self) -> dict:
        from cg_dspy.method.config import ProgramConfig

        return ProgramConfig("baseline").dump()

    def forward(self, conversation, category: str | None = None, draft: str | None = None) -> dspy.Prediction:
        stages = Stages()
        if draft is None:
            draft = stages.run(
                "draft", self.generate, conversation=as_conversation(conversation)
            ).answer
        return dspy.Prediction(answer=draft, draft=draft, path="draft", failures=stages.failures, cost=stages.cost)


class SelfRefine(SavesConfig, dspy.Module):
    """One round of self-feedback, then an unconstrained revision of the whole answer."""

    def __init__(self, *, layout: str | None = None):
        super().__init__()
        self.layout = check_layout(layout)
        self.generate = dspy.Predict(Generate)
        self.feedback = dspy.Predict(SelfFeedback)
        self.refine = dspy.Predict(SelfRefineRevision)

    def config(self) -> dict:
        from cg_dspy.method.config import ProgramConfig

        return ProgramConfig("self-refine", layout=self.layout).dump()

    def forward(self, conversation, category: str | None = None, draft: str | None = None) -> dspy.Prediction:
        with one_task():  # its three calls on one replica when the LM has several
            return self._forward(conversation, draft)

    def _forward(self, conversation, draft: str | None) -> dspy.Prediction:
        conversation = as_conversation(conversation)
        stages = Stages()
        if draft is None:
            draft = stages.run("draft", self.generate, conversation=conversation).answer
        # Both steps continue the plain generation's chat (the baseline's, when paired).
        context = continued(conversation, draft) if self.layout == "chat" else conversation
        answer, feedback, path = draft, None, "revised"
        try:
            feedback = stages.run("feedback", self.feedback, conversation=context, previous_answer=draft).feedback
            answer = stages.run(
                "refine", self.refine, conversation=context, previous_answer=draft, feedback=feedback
            ).revised_answer
        except StageFailure:
            answer, path = draft, "stage-failed"
        return dspy.Prediction(
            answer=answer, draft=draft, feedback=feedback, path=path, failures=stages.failures, cost=stages.cost
        )
