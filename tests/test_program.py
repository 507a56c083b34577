import pytest
from scripted import scripted_lm

from cg_dspy import Baseline, ContextGuard, SelfRefine
from cg_dspy.lms import using
from cg_dspy.lms.adapter import STAGE_HEADER

DRAFT = "- Step 1: oven is 0 C\n- Step 2: oven on to 220 C\n- Step 3: fridge 7 C logged\n- Step 4: door unlocked"
REVISED = DRAFT.replace("- Step 4: door unlocked", "- Step 4: fridge above 5 C: stop and call the manager")
CLEAN_AUDIT = {"confirmed_correct": [{"text": "Step 2: oven on to 220 C", "issue_type": None}],
               "confirmed_data": [{"text": "fridge reads 7 C", "issue_type": None}],
               "possibly_missed": [], "possibly_wrong": []}
FAULTY_AUDIT = {**CLEAN_AUDIT,
                "possibly_wrong": [{"text": "unlocking the door despite the fridge", "issue_type": None}]}


def script(audit=FAULTY_AUDIT, revised=REVISED, **extra):
    base = {
        "draft": DRAFT, "generate": DRAFT,
        "audit": audit,
        "format": {"format_ok": ["uses Step N format"], "format_fail": []},
        "procedure": {"proc_ok": ["Step 1 check before switching on"], "proc_fail": []},
        "rules": {"rules_ok": [], "rules_fail": ["R4 not applied"]},
        "empirical": {"empirical_ok": [], "empirical_issues": []},
        "revise": revised,
        "feedback": "Say to stop and call the manager.",
        "refine": "Call the manager.",
    }
    base.update(extra)
    return base


@pytest.fixture(autouse=True, params=["chat", "inline"])
def layout(request, monkeypatch):
    """Every Algorithm-1 test runs in both layouts."""
    from cg_dspy.method import program

    monkeypatch.setattr(program, "DEFAULT_LAYOUT", request.param)
    return request.param


def run(program, task, replies, draft=None):
    lm, engine = scripted_lm(replies)
    with using(lm):
        pred = program(conversation=task.messages, category=task.category, draft=draft)
    return pred, engine


@pytest.fixture
def proc_task(tasks):
    return tasks["pt-02"]  # Procedural: separate procedure checker


def test_empty_fix_set_returns_draft_without_revision_call(proc_task):
    pred, engine = run(ContextGuard(), proc_task, script(audit=CLEAN_AUDIT))
    assert engine.stages() == ["draft", "audit", "procedure"]
    assert pred.path == "early-return" and pred.answer == DRAFT and pred.fix_set == []
    assert [i.tag for i in pred.protect_set] == ["CONFIRMED-CORRECT", "CONFIRMED-DATA", "PROC-OK"]
    assert pred.guard is None


def test_accepted_revision_is_returned_with_full_trace(proc_task):
    pred, engine = run(ContextGuard(), proc_task, script())
    assert engine.stages() == ["draft", "audit", "procedure", "revise"]
    assert pred.path == "revised" and pred.answer == REVISED and pred.draft == DRAFT
    assert pred.guard.passed
    assert [i.tag for i in pred.fix_set] == ["WRONG"]
    revise_prompt = engine.calls[-1].messages[-1]["content"]
    assert "- [WRONG] unlocking the door despite the fridge" in revise_prompt
    assert "- [PROC-OK] Step 1 check before switching on" in revise_prompt
    assert pred.cost["revise"]["calls"] == 1 and pred.cost["draft"]["calls"] == 1


@pytest.mark.parametrize("revised, reason", [
    ("Call the manager.", "excessive shortening"),
    (DRAFT.replace("220 C", "200 C").replace("\n- Step 4: door unlocked", " and the manager is called now"),
     "protected content lost"),
    ("Step 1 oven is 0 C. Step 2 oven on to 220 C. Step 3 fridge 7 C logged. Step 4 stop, call manager.",
     "structural degradation"),
])
def test_guard_rolls_back_to_draft(proc_task, revised, reason):
    pred, engine = run(ContextGuard(), proc_task, script(revised=revised))
    assert engine.stages()[-1] == "revise"
    assert pred.path == "rolled-back" and pred.answer == DRAFT
    assert any(r.startswith(reason) for r in pred.guard.reasons), pred.guard.reasons


def test_integrated_specialist_makes_no_separate_call_and_feeds_the_audit(tasks):
    pred, engine = run(ContextGuard(), tasks["rs-01"], script())
    assert engine.stages() == ["draft", "audit", "revise"]
    assert "rulebook" in engine.calls[1].messages[-1]["content"].split(STAGE_HEADER)[-1]


def test_empirical_items_with_issue_types_become_empirical_issues(tasks):
    audit = {**CLEAN_AUDIT, "possibly_wrong": [{"text": "weekday mean is 122.6", "issue_type": "numeric"}]}
    pred, _ = run(ContextGuard(), tasks["ed-02"], script(audit=audit))
    assert [(i.tag, i.issue_type) for i in pred.fix_set] == [("EMPIRICAL-ISSUE", "numeric")]


@pytest.mark.parametrize("ablate, stages", [
    ((), ["draft", "audit", "procedure", "revise"]),
    (("reminder",), ["generate", "audit", "procedure", "revise"]),
    (("audit",), ["draft", "procedure"]),  # no audit: F comes from the checker alone (empty here)
    (("specialists",), ["draft", "audit", "revise"]),
    (("protection",), ["draft", "audit", "procedure", "revise"]),
    (("guard",), ["draft", "audit", "procedure", "revise"]),
])
def test_each_ablation_changes_which_calls_are_made(proc_task, ablate, stages):
    pred, engine = run(ContextGuard(ablate=ablate), proc_task, script())
    assert engine.stages() == stages


def test_protection_ablation_leaves_only_specialist_items_in_p(proc_task):
    pred, engine = run(ContextGuard(ablate=("protection",)), proc_task, script())
    assert [i.tag for i in pred.protect_set] == ["PROC-OK"]
    assert "[CONFIRMED-CORRECT]" not in engine.calls[-1].messages[-1]["content"]


def test_guard_ablation_accepts_a_destructive_revision(proc_task):
    pred, _ = run(ContextGuard(ablate=("guard",)), proc_task, script(revised="Call the manager."))
    assert pred.path == "revised" and pred.answer == "Call the manager."


def test_audit_ablation_runs_integrated_specialist_as_a_checker(tasks):
    pred, engine = run(ContextGuard(ablate=("audit",)), tasks["rs-01"], script())
    assert engine.stages() == ["draft", "rules", "revise"]
    assert [i.tag for i in pred.fix_set] == ["RULES-FAIL"]


def test_unparseable_audit_falls_back_to_draft_with_reason(proc_task):
    pred, engine = run(ContextGuard(), proc_task, script(audit="I think it is fine."))
    assert pred.path == "stage-failed" and pred.answer == DRAFT
    assert pred.failures and pred.failures[0].startswith("audit: unusable output")
    assert "revise" not in engine.stages()


@pytest.mark.parametrize("reply", ["", "<think>The fix set says to call the manager {so}", "  \n"])
def test_a_revision_without_an_answer_falls_back_to_draft_after_asking_twice(proc_task, reply):
    pred, engine = run(ContextGuard(), proc_task, script(revise=reply))
    assert pred.path == "stage-failed" and pred.answer == DRAFT
    assert engine.stages().count("revise") == 2  # asked once more before the fallback
    assert pred.failures[0].startswith("revise: unusable output") and pred.failures[0].endswith("asked again")
    assert ("no answer" in pred.failures[-1] or "empty" in pred.failures[-1]) and len(pred.failures) == 2


def test_unparseable_checker_keeps_the_audit_plan(proc_task):
    pred, engine = run(ContextGuard(), proc_task, script(procedure="no idea"))
    assert pred.path == "revised" and pred.failures[0].startswith("procedure_check:")
    assert [i.tag for i in pred.protect_set] == ["CONFIRMED-CORRECT", "CONFIRMED-DATA"]


def test_multi_turn_conversation_reaches_every_stage_as_an_identical_prefix(tasks, layout):
    task = tasks["rs-03"]  # system, user, assistant, user
    pred, engine = run(ContextGuard(), task, script())
    sent = [m.model_dump() for m in task.messages]
    draft_prompt = engine.calls[0].messages
    assert draft_prompt[:-1] == sent[:-1] and draft_prompt[-1]["content"].startswith(sent[-1]["content"] + STAGE_HEADER)
    for call in engine.calls[1:]:
        assert call.messages[-1]["role"] == "user"
        if layout == "chat":  # the draft's chat, continued: the whole draft prompt, the draft, the stage
            assert call.messages[:-2] == draft_prompt
            assert call.messages[-2] == {"role": "assistant", "content": DRAFT}
            assert DRAFT not in call.messages[-1]["content"]  # not repeated in the stage's turn
        else:
            assert call.messages[:-1] == sent[:-1]
            assert call.messages[-1]["content"].startswith(sent[-1]["content"] + STAGE_HEADER)
            assert DRAFT in call.messages[-1]["content"]


def test_two_rounds_reaudit_the_revision(proc_task):
    audits = iter([FAULTY_AUDIT, CLEAN_AUDIT])
    replies = script()

    def reply(stage, messages):
        return next(audits) if stage == "audit" else replies[stage]

    pred, engine = run(ContextGuard(max_rounds=2), proc_task, reply)
    assert engine.stages() == ["draft", "audit", "procedure", "revise", "audit", "procedure"]
    assert pred.path == "revised" and pred.answer == REVISED and len(pred.rounds) == 2


def test_given_draft_skips_the_draft_stage(proc_task):
    pred, engine = run(ContextGuard(), proc_task, script(audit=CLEAN_AUDIT), draft="given")
    assert engine.stages() == ["audit", "procedure"] and pred.answer == "given"


def test_baseline_is_one_plain_generation(proc_task):
    pred, engine = run(Baseline(), proc_task, script())
    assert engine.stages() == ["generate"] and pred.answer == DRAFT
    assert "re-read" not in engine.calls[0].messages[-1]["content"]


def test_self_refine_makes_feedback_and_revision_calls_on_the_same_draft(proc_task):
    pred, engine = run(SelfRefine(), proc_task, script())
    assert engine.stages() == ["generate", "feedback", "refine"]
    assert pred.draft == DRAFT and pred.answer == "Call the manager."
    assert "Say to stop and call the manager." in engine.calls[-1].messages[-1]["content"]


def test_baseline_and_self_refine_share_the_draft_prompt(proc_task):
    _, base = run(Baseline(), proc_task, script())
    _, refine = run(SelfRefine(), proc_task, script())
    assert base.calls[0].messages == refine.calls[0].messages


def test_unknown_ablation_is_rejected():
    with pytest.raises(ValueError, match="unknown ablation"):
        ContextGuard(ablate=("everything",))


@pytest.mark.parametrize("reply, answer", [
    ('{"answer": "Step 1."}', '{"answer": "Step 1."}'),  # an answer that is JSON stays what the model said
    ("<think>It wants steps {like this}.</think>\n\n| step | do |\n|---|---|\n| 1 | oven |",
     "| step | do |\n|---|---|\n| 1 | oven |"),
    ("The plan is fine.</think>Step 1: check the oven.", "Step 1: check the oven."),  # template opened <think>
])
def test_a_free_text_stage_takes_the_reply_itself_without_its_reasoning(proc_task, reply, answer):
    pred, _ = run(Baseline(), proc_task, script(generate=reply))
    assert pred.answer == answer and pred.failures == []


def test_a_draft_without_an_answer_fails_the_task(proc_task):
    from cg_dspy.method.stages import StageFailure

    with pytest.raises(StageFailure, match="draft: unusable output.*no answer"):
        run(ContextGuard(), proc_task, script(draft="<think>I will answer after I check the oven and"))


def test_saved_program_rebuilds_with_its_configuration(tmp_path, layout):
    from cg_dspy.method.specialists import SpecialistPolicy
    from cg_dspy.saved import load_program

    policy = {"Rule System Application": SpecialistPolicy("rules", "separate")}
    program = ContextGuard(ablate=("guard",), max_rounds=2, min_length_ratio=0.7, policy=policy)
    program.revise.signature = program.revise.signature.with_instructions("Fix only the fix set.")
    program.save(str(tmp_path / "p.json"))
    loaded = load_program(tmp_path / "p.json")
    assert loaded.config() == {"method": "contextguard", "ablate": ["guard"], "max_rounds": 2,
                               "min_length_ratio": 0.7, "policy": {"Rule System Application": ["rules", "separate"]},
                               "layout": layout}
    assert loaded.revise.signature.instructions == "Fix only the fix set."
    SelfRefine().save(str(tmp_path / "s.json"))
    refine = load_program(tmp_path / "s.json")
    assert isinstance(refine, SelfRefine) and refine.layout == layout


def test_findings_listed_as_plain_strings_are_findings_not_a_failed_stage(proc_task):
    """Real models often answer `possibly_wrong: ["..."]` instead of objects with a text."""
    plain = {"confirmed_correct": ["Step 2: oven on to 220 C"], "confirmed_data": [],
             "possibly_missed": [], "possibly_wrong": ["unlocking the door despite the fridge"]}
    pred, engine = run(ContextGuard(), proc_task, script(audit=plain))
    assert engine.stages() == ["draft", "audit", "procedure", "revise"]
    assert pred.path == "revised" and pred.answer == REVISED
    assert [i.text for i in pred.fix_set] == ["unlocking the door despite the fridge"]


def test_each_stage_span_carries_its_own_call_not_the_running_total(proc_task):
    from contextlib import contextmanager

    from cg_dspy.core.observe import observing

    seen = []

    class Seen:
        trace_ref = None

        def __init__(self, name):
            self.name, self.attributes = name, {}
            seen.append(self)

        def set(self, outputs=None, **attributes):
            self.attributes.update(attributes, outputs=outputs)

    class Observer:
        @contextmanager
        def span(self, name, attributes):
            yield Seen(name)

        def graded(self, task):
            pass

    audits = iter([FAULTY_AUDIT, CLEAN_AUDIT])
    replies = script()
    with observing(Observer()):
        run(ContextGuard(max_rounds=2), proc_task,
            lambda stage, messages: next(audits) if stage == "audit" else replies[stage])
    audit_spans = [s for s in seen if s.name == "audit"]
    assert [s.attributes["calls"] for s in audit_spans] == [1, 1]  # not 1, then 2
    assert [len(s.attributes["outputs"]["possibly_wrong"]) for s in audit_spans] == [1, 0]
