import dspy
import pytest
from scripted import scripted_lm

from cg_dspy.clbench.grading import grade_row
from cg_dspy.judge.voting import RubricJudge, majority_decided, majority_label


def votes_lm(sequence_by_requirement, cache=False):
    """A judge LM that answers each requirement's votes from a fixed sequence."""
    counters = {}

    def reply(stage, messages):
        text = messages[-1]["content"]
        req = next(r for r in sequence_by_requirement if r in text)
        i = counters.get(req, 0)
        counters[req] = i + 1
        return {"reason": f"vote {i}", "satisfaction_status": sequence_by_requirement[req][i]}

    return scripted_lm(reply, temperature=0.6, cache=cache)


def judge(lm, requirement, votes=3, early_stop=True):
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        return RubricJudge(votes=votes, early_stop=early_stop)(response="answer", requirement=requirement)


@pytest.mark.parametrize("seq", [["yes", "yes", "no"], ["no", "no", "yes"], ["yes", "no", "yes"],
                                 ["no", "yes", "no"], ["yes", "no", "no"]])
def test_early_stop_gives_full_k_label_with_no_more_calls(seq):
    lm_full, full = votes_lm({"REQ": seq})
    lm_early, early = votes_lm({"REQ": seq})
    assert judge(lm_full, "REQ", early_stop=False).status == judge(lm_early, "REQ").status == majority_label(seq, 3)
    assert len(full.calls) == 3
    assert len(early.calls) == (2 if seq[0] == seq[1] else 3)


def test_disagreeing_votes_resolve_by_majority():
    lm, engine = votes_lm({"REQ": ["yes", "no", "yes", "no", "no"]})
    pred = judge(lm, "REQ", votes=5, early_stop=False)
    assert pred.status == "no" and [v["status"] for v in pred.votes] == ["yes", "no", "yes", "no", "no"]


def test_votes_are_distinct_samples_not_cache_repeats():
    lm, engine = votes_lm({"REQ": ["yes", "no", "no"]}, cache=True)
    judge(lm, "REQ", early_stop=False)
    assert len(engine.calls) == 3  # the cache is on; each vote still reached the LM
    judge(lm, "REQ", early_stop=False)
    assert len(engine.calls) == 3  # a rerun is served from the cache


def test_majority_helpers():
    assert majority_decided(2, 0, 3) and majority_decided(0, 2, 3) and not majority_decided(1, 1, 3)
    assert majority_decided(0, 2, 4)  # yes can reach at most 2 of 4: not a majority
    assert not majority_decided(2, 1, 4)
    assert majority_label(["yes", "yes", "no", "no"], 4) == "no"


def test_grade_row_rubric_protocol_writes_official_fields(tasks):
    task = tasks["demo-ed-1"] if "demo-ed-1" in tasks else next(iter(tasks.values()))
    rubrics = ["R-ONE must hold", "R-TWO must hold"]
    lm, engine = votes_lm({"R-ONE": ["yes", "yes", "yes"], "R-TWO": ["yes", "no", "no"]})
    row = {"idx": "x", "messages": [m.model_dump() for m in task.messages], "model_output": "an answer",
           "rubrics": rubrics, "metadata": task.metadata.model_dump()}
    graded, grade = grade_row(row, protocol="rubric", judge_lm=lm, votes=3)
    assert graded["requirement_status"] == ["yes", "no"] and graded["score"] == 0
    assert [(v.rubric, v.status, v.votes) for v in grade.verdicts] == [
        ("R-ONE must hold", "yes", ("yes", "yes")), ("R-TWO must hold", "no", ("yes", "no", "no"))]
    assert not grade.solved
    assert graded["votes"] == [["yes", "yes"], ["yes", "no", "no"]]
    assert graded["grading_rationale"].startswith("Requirement 1: yes")


def test_joint_protocol_is_one_call_all_or_nothing():
    lm, engine = scripted_lm({"joint": {"grading_rationale": "ok", "requirement_status": ["yes", "yes"]}})
    row = {"idx": "x", "model_output": "an answer", "rubrics": ["a", "b"], "metadata": {}}
    graded, _ = grade_row(row, protocol="joint", judge_lm=lm)
    assert engine.stages() == ["joint"] and graded["score"] == 1 and graded["requirement_status"] == ["yes", "yes"]
    lm, _ = scripted_lm({"joint": {"grading_rationale": "ok", "requirement_status": ["yes"]}})
    graded, _ = grade_row({**row}, protocol="joint", judge_lm=lm)
    assert graded["requirement_status"] == ["yes", "no"] and graded["score"] == 0 and "judge_note" in graded


def test_failed_generation_is_unsolved_without_judge_calls():
    lm, engine = scripted_lm({})
    graded, grade = grade_row({"idx": "x", "model_output": "", "rubrics": ["a", "b", "c"], "error": "timeout"},
                              protocol="rubric", judge_lm=lm)
    assert engine.calls == [] and not grade.solved and grade.pass_rate == 0.0
    assert [(v.rubric, v.status, v.reason) for v in grade.verdicts] == [(r, "no", "No usable model output (timeout)")
                                                                       for r in ("a", "b", "c")]
    assert graded["requirement_status"] == ["no"] * 3 and graded["score"] == 0
    assert "timeout" in graded["grading_rationale"]


def test_an_unparseable_vote_is_asked_again_and_then_fails_the_grading_not_counts_as_no():
    from cg_dspy.judge.voting import JUDGE_ATTEMPTS, JudgeFailure

    replies = iter(["maybe?", "<think>hmm</think> still thinking", '{"reason": "ok", "satisfaction_status": "yes"}'])
    lm, engine = scripted_lm(lambda stage, messages: next(replies), temperature=0.6)
    assert judge(lm, "REQ", votes=1).status == "yes" and len(engine.calls) == 3  # the third try parsed
    lm, engine = scripted_lm({"judge": "maybe?"}, temperature=0.6)
    with pytest.raises(JudgeFailure, match=f"after {JUDGE_ATTEMPTS} tries"):
        judge(lm, "REQ")
    assert len(engine.calls) == JUDGE_ATTEMPTS
