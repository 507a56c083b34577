"""A rubric-level metric for DSPy optimizers.

score = fraction of the example's rubrics the judge marks satisfied (dense signal for
optimizers), or, with `strict`, 1 only when every rubric is satisfied (CL-bench's
task-solving rule). The judge is the paper's: K votes per requirement (3 by default),
majority label, early stop. With `feedback` (GEPA), it returns `dspy.Prediction(score,
feedback)` where the feedback names the failed requirements and says what the stage
being tuned did: an audit (the generic one or an integrated specialist's) or a checker
is told which failed requirements it did not flag; the revision is told which
requirements it repaired and which it broke (the draft is judged too, for that), and an
edit-mode revision also which of its edits could not be applied and why. Judge
verdicts are memoised per (answer, requirement): re-scoring an answer an optimizer has
seen before costs no LM call.
"""

from __future__ import annotations

import threading

import dspy

from cg_dspy.judge.voting import DEFAULT_VOTES, JudgeFailure, RubricJudge
from cg_dspy.lms import using


class RubricMetric:
    """`metric(example, prediction, trace=None, pred_name=None, pred_trace=None)`."""

    def __init__(self, judge_lm, *, votes: int = DEFAULT_VOTES, strict: bool = False, feedback: bool = False,
                 memo: dict | None = None):
        self.judge_lm = judge_lm
        self.votes = votes
        self.strict = strict
        self.feedback = feedback
        self.judge = RubricJudge(votes=votes)
        self.memo: dict[tuple[str, str], str] = {} if memo is None else memo
        self._lock = threading.Lock()
        self.judge_calls = 0
        # The name MLflow gives the score it attaches to each prediction's trace.
        self.__name__ = "task_solved" if strict else "rubric_pass_rate"

    def status(self, answer: str, requirement: str) -> str:
        """The judge's majority label, memoised."""
        key = (answer, requirement)
        with self._lock:
            if key in self.memo:
                return self.memo[key]
        try:
            with using(self.judge_lm):
                pred = self.judge(response=answer, requirement=requirement)
        except JudgeFailure:
            return "no"  # no verdict: not satisfied for this score, and not remembered
        with self._lock:
            self.judge_calls += len(pred.votes)
            self.memo[key] = pred.status
        return pred.status

    def labels(self, answer: str, rubrics: list[str]) -> list[bool]:
        answer = (answer or "").strip()
        return [self.status(answer, r) == "yes" if answer else False for r in rubrics]

    def __call__(self, example, prediction, trace=None, pred_name=None, pred_trace=None):
        rubrics = list(example.rubrics)
        labels = self.labels(getattr(prediction, "answer", None), rubrics)
        passed = sum(labels)
        score = float(passed == len(rubrics)) if self.strict else passed / max(1, len(rubrics))
        if not self.feedback:
            return score
        stage = (pred_name or "").split(".")[-1]
        draft = None
        started = getattr(prediction, "draft", None)
        if stage in ("revise", "edit") and started not in (None, getattr(prediction, "answer", None)):
            draft = self.labels(started, rubrics)  # what the revision started from
        return dspy.Prediction(score=score, feedback=explain(rubrics, labels, prediction, stage, draft))


def explain(rubrics: list[str], labels: list[bool], prediction, stage: str, draft: list[bool] | None = None) -> str:
    """Feedback for a reflective optimizer: what failed, and what the tuned stage did."""
    failed = [r for r, ok in zip(rubrics, labels) if not ok]
    lines = ["Every requirement is satisfied."] if not failed else \
        [f"{len(failed)} requirement(s) failed:"] + [f"- {r}" for r in failed]
    path = getattr(prediction, "path", None)
    fix = getattr(prediction, "fix_set", None) or []
    protect = getattr(prediction, "protect_set", None) or []
    if (stage == "audit" or stage.startswith("audit_") or stage.endswith("_check")) and failed:
        who = "The checker" if stage.endswith("_check") else "The audit"
        flagged = " ".join(i.text.lower() for i in fix)
        unflagged = [r for r in failed if not any(w in flagged for w in _keywords(r))]
        if unflagged:
            lines.append(f"{who} did not flag these failed requirements as missing, wrong or violated:")
            lines += [f"- {r}" for r in unflagged]
        lines.append(f"{who} left {len(fix)} item(s) in the fix set and {len(protect)} in the protection set.")
    elif stage in ("revise", "edit"):
        guard = getattr(prediction, "guard", None)
        edits = getattr(prediction, "edits", None)
        if stage == "edit" and edits is not None and edits.dropped:
            lines.append(f"{len(edits.dropped)} of {len(edits.edits)} edit(s) could not be applied:")
            lines += [f"- edit {d.edit}: {d.reason}" for d in edits.dropped]
        if draft is not None:
            repaired = [r for r, before, after in zip(rubrics, draft, labels) if after and not before]
            broken = [r for r, before, after in zip(rubrics, draft, labels) if before and not after]
            lines.append(f"Repairs (failed in the draft, satisfied after the revision): {len(repaired)}"
                         + "".join(f"\n- {r}" for r in repaired))
            lines.append(f"Regressions (satisfied in the draft, broken by the revision): {len(broken)}"
                         + "".join(f"\n- {r}" for r in broken))
            if broken:
                lines.append("Keep what the draft already satisfied: change only what the fix set names.")
        if path == "rolled-back" and guard is not None:
            lines.append("The revision was rolled back by the guard: " + "; ".join(guard.reasons))
        elif path == "revised" and failed:
            lines.append("The revision was accepted but did not fix everything; it was asked to fix:")
            lines += [f"- {i.render()}" for i in fix]
        elif path == "no-edit":
            lines.append("No edit applied: the answer stayed the draft.")
        elif path == "early-return":
            lines.append("No revision ran: the fix set was empty.")
    if path:
        lines.append(f"Path taken: {path}.")
    return "\n".join(lines)


def _keywords(requirement: str) -> list[str]:
    words = [w.strip(".,;:'\"()").lower() for w in requirement.split()]
    return [w for w in words if len(w) > 5][:4] or words[:1]
