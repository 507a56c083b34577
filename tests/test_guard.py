import json

from cg_dspy.method.guard import concrete_content, revision_guard, structure_of
from cg_dspy.method.schemas import PlanItem

DRAFT = ("## Ruling\nThe first Spark is blocked (R3).\nThe second Spark deals 6 damage (R4).\n"
         "## Result\nTheo has 6 life.")


def p(tag, text):
    return PlanItem(tag=tag, text=text)


def test_faithful_revision_passes():
    revised = DRAFT + "\nRules cited: R3, R4."
    verdict = revision_guard(revised, DRAFT, [p("CONFIRMED-DATA", "Theo has 6 life")], [p("MISSED", "cite rules")])
    assert verdict.passed and verdict.reasons == []
    assert verdict.length_ratio > 1


def test_excessive_shortening_rolls_back():
    verdict = revision_guard("Theo has 6 life.", DRAFT, [], [p("WRONG", "x")])
    assert not verdict.passed
    assert verdict.reasons[0].startswith("excessive shortening")
    assert verdict.length_ratio < 0.5


def test_lost_protected_number_rolls_back():
    revised = DRAFT.replace("6 damage", "3 damage").replace("6 life", "9 life")
    verdict = revision_guard(revised, DRAFT, [p("CONFIRMED-CORRECT", "Second Spark deals 6 damage on Mia's turn")],
                             [p("MISSED", "cite rules")])
    assert not verdict.passed
    assert verdict.reasons == ["protected content lost from [CONFIRMED-CORRECT]: 6"]


def test_content_named_by_a_fix_item_may_change():
    revised = DRAFT.replace("6 life", "9 life")
    verdict = revision_guard(revised, DRAFT, [p("CONFIRMED-DATA", "Theo has 6 life")],
                             [p("WRONG", "Theo should end with 9 life, not 6")])
    assert verdict.passed


def test_lost_quoted_string_and_label_roll_back():
    draft = 'Status: DONE\nThe answer ends with "Ask your Brightwater pharmacist."'
    revised = "The answer is complete and all steps are listed in full detail here."
    verdict = revision_guard(revised, draft, [p("FORMAT-OK", 'ends with "Ask your Brightwater pharmacist."'),
                                              p("PROC-OK", "Status: marked")], [p("MISSED", "x")])
    assert not verdict.passed
    assert any("ask your brightwater pharmacist." in r for r in verdict.reasons)
    assert any("[PROC-OK]: status" in r for r in verdict.reasons)


def test_structure_collapse_rolls_back_unless_a_fix_asks_for_format():
    draft = "- Step 1: oven 0 C\n- Step 2: oven to 220 C\n- Step 3: log fridge 7 C\n- Step 4: stop, call manager"
    revised = "First check the oven, switch it to 220 C, log the fridge at 7 C, then stop and call the manager now."
    verdict = revision_guard(revised, draft, [], [p("MISSED", "mention the manager")])
    assert not verdict.passed
    assert verdict.reasons == ["structural degradation: list collapsed from 4 to 0 lines"]
    assert revision_guard(revised, draft, [], [p("FORMAT-FAIL", "must be prose")]).passed


def test_json_draft_must_stay_json():
    draft = json.dumps({"winner": "Ada", "scores": {"Ada": 26, "Bo": 22}, "rules_used": ["G1", "G2", "G3"]})
    broken = draft[:-1] + " and Ada wins"
    verdict = revision_guard(broken, draft, [], [p("WRONG", "add G4")])
    assert verdict.reasons == ["structural degradation: the draft is valid JSON, the revision is not"]


def test_every_triggered_condition_is_reported():
    draft = "- a 12\n- b 13\n- c 14\n- d 15 and more words to make it long enough"
    verdict = revision_guard("nothing", draft, [p("CONFIRMED-DATA", "b is 13")], [p("MISSED", "x")])
    assert len(verdict.reasons) == 3


def test_concrete_content_and_structure_helpers():
    assert concrete_content('Fine: 80 crowns per "market day", 1.5% interest') >= {"80", "1.5%", "market day", "fine"}
    assert structure_of("| a | b |\n| 1 | 2 |\n# H\n1. x\n2. y") == {"json": 0, "table": 2, "list": 2, "sections": 1}
    assert structure_of('```json\n{"a": 1}\n```')["json"] == 1
