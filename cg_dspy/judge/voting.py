"""Rubric judging (paper Appendix C, Prompt 8) and CL-bench's joint protocol.

`rubric` protocol: each requirement is judged alone, K votes drawn as distinct samples
(each vote has its own `rollout_id`, so the cache never hands back a repeat), label =
majority (yes only if yes-votes > K/2). Voting stops as soon as the remaining votes
cannot change the majority: same labels as full K, fewer calls.
`joint` protocol: all rubrics in one prompt, as CL-bench's official `eval.py` does.
A task is solved only when every requirement is satisfied. The defaults are the
paper's: K = 3, early stop, votes sampled at temperature 0.6.
"""

from __future__ import annotations

import contextvars
import functools
from concurrent.futures import ThreadPoolExecutor, wait

import dspy
import pydantic
from dspy.utils.exceptions import AdapterParseError

from cg_dspy.judge.signatures import JudgeAllRubrics, JudgeLabel, JudgeRequirement
from cg_dspy.judge.verdicts import Grade, Verdict
from cg_dspy.lms import LMSettings, build_lm, using

DEFAULT_VOTES = 3
DEFAULT_TEMPERATURE = 0.6  # votes are samples: at 0 every vote would be the same
PROTOCOLS = ("rubric", "joint")


def judge_lm(settings: LMSettings) -> dspy.LM:
    """The judge LM the paper's protocol needs: sampled at DEFAULT_TEMPERATURE unless the
    settings name a temperature. The command and a library caller get the same judge."""
    return build_lm(settings, default_temperature=DEFAULT_TEMPERATURE)


def majority_decided(yes: int, no: int, k: int) -> bool:
    """True once the majority label over k votes can no longer change."""
    remaining = k - yes - no
    return yes > k / 2 or yes + remaining <= k / 2


def majority_label(votes: list[str], k: int) -> str:
    """'yes' only if more than half of the k votes are 'yes' (Eq. 13)."""
    return "yes" if sum(v == "yes" for v in votes) > k / 2 else "no"


JUDGE_ATTEMPTS = 3


class JudgeFailure(Exception):
    """The judge gave no usable verdict, even when asked again: the task is not graded."""


def ask(predictor, what: str, *, rollout: int | None = 0, **inputs):
    """`predictor(**inputs)`, asked again up to JUDGE_ATTEMPTS times while the reply
    does not parse; each attempt is its own sample (its own cache entry). `rollout=None`
    for an LM without a cache, at temperature 0, where a rollout id means nothing."""
    for attempt in range(JUDGE_ATTEMPTS):
        config = {} if rollout is None else {"config": {"rollout_id": rollout + 1000 * attempt}}
        try:
            return predictor(**inputs, **config)
        except (AdapterParseError, pydantic.ValidationError) as exc:
            last = exc
    first = (str(last).strip().splitlines() or [""])[0][:200]
    raise JudgeFailure(f"no usable judge verdict for {what} after {JUDGE_ATTEMPTS} tries "
                       f"({type(last).__name__}: {first})")


class RubricJudge(dspy.Module):
    """Per-requirement judge with K votes and early-stopped majority."""

    def __init__(self, votes: int = 3, early_stop: bool = True):
        super().__init__()
        if votes < 1:
            raise ValueError("votes must be at least 1")
        self.votes = votes
        self.early_stop = early_stop
        self.judge = dspy.Predict(JudgeRequirement)

    def forward(self, response: str, requirement: str) -> dspy.Prediction:
        votes: list[dict] = []
        yes = no = 0
        for k in range(self.votes):
            if self.early_stop and majority_decided(yes, no, self.votes):
                break
            vote = self.vote(response, requirement, k)
            votes.append(vote)
            yes += vote["status"] == "yes"
            no += vote["status"] != "yes"
        labels = [v["status"] for v in votes]
        return dspy.Prediction(status=majority_label(labels, self.votes), votes=votes)

    def vote(self, response: str, requirement: str, k: int) -> dict:
        """One judge sample. A reply that does not parse is asked for again (a fresh
        sample each time); after `JUDGE_ATTEMPTS` the vote is a JudgeFailure, never a 'no'."""
        out = ask(self.judge, f"requirement {requirement[:80]!r}", response=response, requirement=requirement,
                  rollout=k)
        return {"status": out.satisfaction_status, "reason": out.reason}


@functools.lru_cache(maxsize=256)
def statuses(n: int) -> type[pydantic.RootModel]:
    """The joint judge's status list for a task of `n` requirements: its schema asks for
    exactly n labels (a grammar-constrained server produces n), while a reply of another
    length still parses and is padded below."""
    return type(f"RequirementStatuses{n}", (pydantic.RootModel[list[JudgeLabel]],),
                {"model_config": pydantic.ConfigDict(json_schema_extra={"minItems": n, "maxItems": n})})


class JointJudge(dspy.Module):
    """CL-bench's official protocol: every rubric in one prompt, all-or-nothing."""

    def __init__(self):
        super().__init__()
        self.judge = dspy.Predict(JudgeAllRubrics)

    def forward(self, response: str, rubrics: list[str]) -> dspy.Prediction:
        numbered = "\n".join(f"{i + 1}. {r}" for i, r in enumerate(rubrics))
        note = ""
        sized = dspy.Predict(self.judge.signature.with_updated_fields("requirement_status",
                                                                      type_=statuses(len(rubrics))))
        sized.demos = self.judge.demos
        out = ask(sized, "the rubric list", response=response, rubrics=numbered)
        found = out.requirement_status
        status, rationale = list(getattr(found, "root", found) or []), out.grading_rationale
        if len(status) != len(rubrics):
            note = f"judge gave {len(status)} labels for {len(rubrics)} rubrics; missing ones are 'no'"
            status = (status + ["no"] * len(rubrics))[: len(rubrics)]
        return dspy.Prediction(status=status, rationale=rationale, note=note)


def grade(answer: str, rubrics: list[str], *, judge_lm, protocol: str = "rubric", votes: int = DEFAULT_VOTES,
          early_stop: bool = True, pool: ThreadPoolExecutor | None = None) -> Grade:
    """`answer` graded against each of `rubrics` by `judge_lm` (requirements judged on
    `pool`'s threads when given)."""
    if protocol == "joint":
        with using(judge_lm):
            out = JointJudge()(response=answer, rubrics=rubrics)
        return Grade([Verdict(r, s) for r, s in zip(rubrics, out.status)], protocol, out.rationale or "", out.note)
    if protocol != "rubric":
        raise ValueError(f"unknown protocol {protocol!r}; choose from {PROTOCOLS}")
    judge = RubricJudge(votes=votes, early_stop=early_stop)

    def one(requirement: str) -> Verdict:
        with using(judge_lm):
            found = judge(response=answer, requirement=requirement)
        return Verdict(requirement, found.status, tuple(v["status"] for v in found.votes),
                       (found.votes[-1].get("reason") or "").strip())

    # Each requirement runs in this task's context (its replica pin, lms.replicas.pinned).
    futures = [pool.submit(contextvars.copy_context().run, one, r) for r in rubrics] if pool else None
    if futures:
        wait(futures)  # all of them, even when one fails: none may outlive its task's pin
    verdicts = [f.result() for f in futures] if futures else [one(r) for r in rubrics]
    # The rationale is for reading, one line per requirement, so no reason can pose as another line.
    rationale = "\n".join(f"Requirement {i + 1}: {v.status} ({' '.join(v.reason.split())[:300]})"
                          for i, v in enumerate(verdicts))
    return Grade(verdicts, protocol, rationale)
