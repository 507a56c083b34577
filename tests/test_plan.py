from cg_dspy.method import specialists
from cg_dspy.method.plan import build_plan, render_items
from cg_dspy.method.schemas import AuditItem, AuditReport, SpecialistReport


def audit(**quadrants):
    return AuditReport(**{k: [AuditItem(text=t) if isinstance(t, str) else t for t in v] for k, v in quadrants.items()})


def tags(items):
    return [(i.tag, i.text) for i in items]


def test_fix_set_is_missed_and_wrong_plus_specialist_violations():
    plan = build_plan(
        audit(confirmed_correct=["keeps bullet format"], confirmed_data=["dose 20 mg"],
              possibly_missed=["no closing line"], possibly_wrong=["claims 40 mg for children"]),
        SpecialistReport(kind="format", satisfied=["three bullets"], violations=["missing sign-off"]),
    )
    assert tags(plan.fix_set) == [("MISSED", "no closing line"), ("WRONG", "claims 40 mg for children"),
                                  ("FORMAT-FAIL", "missing sign-off")]
    assert tags(plan.protect_set) == [("CONFIRMED-CORRECT", "keeps bullet format"),
                                      ("CONFIRMED-DATA", "dose 20 mg"), ("FORMAT-OK", "three bullets")]


def test_each_specialist_kind_gets_its_own_tags():
    expected = {"format": ("FORMAT-FAIL", "FORMAT-OK"), "procedure": ("PROC-FAIL", "PROC-OK"),
                "rules": ("RULES-FAIL", "RULES-OK"), "empirical": ("EMPIRICAL-ISSUE", "EMPIRICAL-OK")}
    for kind, (fail, ok) in expected.items():
        plan = build_plan(None, SpecialistReport(kind=kind, satisfied=["a"], violations=["b"]))
        assert tags(plan.fix_set) == [(fail, "b")]
        assert tags(plan.protect_set) == [(ok, "a")]


def test_typed_audit_items_are_the_integrated_empirical_signal():
    report = audit(possibly_missed=[AuditItem(text="Light A mean missing", issue_type="coverage"), "units"],
                   possibly_wrong=[AuditItem(text="difference is 1.9 not 2.1", issue_type="numeric")])
    plan = build_plan(report, None)
    assert [(i.tag, i.issue_type) for i in plan.fix_set] == [
        ("EMPIRICAL-ISSUE", "coverage"), ("MISSED", None), ("EMPIRICAL-ISSUE", "numeric")]
    assert "- [EMPIRICAL-ISSUE] (numeric) difference is 1.9 not 2.1" in render_items(plan.fix_set)


def test_protection_ablation_drops_quadrants_a_and_b_but_keeps_specialist_ok():
    plan = build_plan(audit(confirmed_correct=["x"], confirmed_data=["y"], possibly_missed=["z"]),
                      SpecialistReport(kind="procedure", satisfied=["step order"], violations=[]),
                      protect_audit=False)
    assert tags(plan.protect_set) == [("PROC-OK", "step order")]
    assert tags(plan.fix_set) == [("MISSED", "z")]


def test_union_removes_duplicates_across_sources():
    plan = build_plan(audit(possibly_missed=["Missing  sign-off"], possibly_wrong=["missing sign-off"]),
                      SpecialistReport(kind="format", violations=["MISSING SIGN-OFF", "bullets"]))
    assert tags(plan.fix_set) == [("MISSED", "Missing  sign-off"), ("FORMAT-FAIL", "bullets")]


def test_empty_audit_and_no_specialist_give_empty_fix_set():
    plan = build_plan(audit(confirmed_correct=["all good"]), None)
    assert plan.fix_set == [] and render_items(plan.fix_set) == "(none)"


def test_items_are_bounded_in_count_and_length():
    from cg_dspy.method.schemas import MAX_ITEM_CHARS, MAX_ITEMS

    report = AuditReport(possibly_missed=[{"text": "x" * 5000}] * 100)
    assert len(report.possibly_missed) == MAX_ITEMS == 48
    assert len(report.possibly_missed[0].text) == MAX_ITEM_CHARS == 1000


def test_unknown_issue_type_becomes_none():
    assert AuditItem(text="a", issue_type="Numeric ").issue_type == "numeric"
    assert AuditItem(text="a", issue_type="vibes").issue_type is None


def test_default_category_policy_follows_the_paper():
    assert specialists.resolve("Domain Knowledge Reasoning") == specialists.SpecialistPolicy("format", "separate")
    assert specialists.resolve("Procedural Task Execution") == specialists.SpecialistPolicy("procedure", "separate")
    assert specialists.resolve("Rule System Application") == specialists.SpecialistPolicy("rules", "integrated")
    assert specialists.resolve("Empirical Discovery & Simulation").mode == "integrated"
    # with no audit to integrate into, the specialist becomes a separate checker
    assert specialists.resolve("Rule System Application", audit_enabled=False).mode == "separate"
