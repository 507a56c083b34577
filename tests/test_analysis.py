import json

import pytest
from conftest import shared_file

from cg_dspy.clbench.lengths import length_bin
from cg_dspy.reports import analysis
from cg_dspy.reports.render import markdown
from cg_dspy.reports.runs import runs_by_label


def row(idx, cat, sub, status, rubrics=None, votes=None):
    r = {"idx": idx, "messages": [{"role": "user", "content": "short"}],
         "rubrics": rubrics or [f"The response should mention item {i}." for i in range(len(status))],
         "metadata": {"task_id": idx, "context_id": f"c-{idx}", "context_category": cat, "sub_category": sub},
         "requirement_status": status, "score": int(all(s == "yes" for s in status))}
    if votes is not None:
        r["votes"] = votes
    return r


D, R = "Domain Knowledge Reasoning", "Rule System Application"
BEFORE = [
    row("t1", D, "Science", ["yes", "yes"]),
    row("t2", D, "Finance", ["yes", "no", "yes"]),
    row("t3", R, "Game Mechanics", ["no", "no", "yes", "no"]),
    row("t4", R, "Game Mechanics", ["no"] * 10),
]
AFTER = [
    row("t1", D, "Science", ["yes", "no"]),
    row("t2", D, "Finance", ["yes", "yes", "yes"]),
    row("t3", R, "Game Mechanics", ["yes", "no", "yes", "yes"]),
]  # t4 missing: left out of the comparison, and counted


def test_run_summary_matches_hand_counts():
    summary = analysis.run_summary(BEFORE)
    assert (summary.tasks, summary.rate.solved, summary.task_solving_rate) == (4, 1, 25.0)
    assert summary.by_category[R].ci95 == [0.0, 65.76]  # a rate knows its interval
    s = summary.to_dict()
    assert (s["tasks"], s["solved"], s["task_solving_rate"]) == (4, 1, 25.0)
    # Wilson's intervals of 1/2 and 0/2 (scipy's values are checked in test_statistics)
    assert s["by_category"] == {D: {"tasks": 2, "solved": 1, "task_solving_rate": 50.0,
                                    "task_solving_rate_ci95": [9.45, 90.55]},
                                R: {"tasks": 2, "solved": 0, "task_solving_rate": 0.0,
                                    "task_solving_rate_ci95": [0.0, 65.76]}}
    assert s["by_sub_category"]["Game Mechanics"] == {"tasks": 2, "solved": 0, "task_solving_rate": 0.0,
                                                      "task_solving_rate_ci95": [0.0, 65.76], "category": R}
    assert s["by_length_bin"] == {"0-4K": {"tasks": 4, "solved": 1, "task_solving_rate": 25.0,
                                           "task_solving_rate_ci95": [4.56, 69.94]}}
    assert s["near_miss"] == {"0": 1, "1": 1, "2-3": 1, "4-8": 0, ">8": 1}
    # pass fractions 1, 2/3, 1/4, 0: their mean, and a bootstrap interval around it
    assert s["rubric_pass_rate"] == 47.92
    lo, hi = s["rubric_pass_rate_ci95"]
    assert 0 <= lo < 47.92 < hi <= 100


def test_comparison_matches_hand_counts_over_the_tasks_both_runs_hold():
    comparison = analysis.compare(BEFORE, AFTER)
    assert (comparison.before, comparison.after, comparison.paired.tasks) == ("before", "after", 3)
    c = comparison.to_dict()
    assert (c["tasks_compared"], c["tasks_only_before"], c["tasks_only_after"]) == (3, 1, 0)
    assert c["migration"]["0"] == {"0": 0, "1": 1, "2-3": 0, "4-8": 0, ">8": 0}
    assert c["migration"]["1"]["0"] == 1
    assert c["migration"]["2-3"]["1"] == 1
    assert c["migration"][">8"][">8"] == 0  # t4 is not paired
    assert sum(sum(r.values()) for r in c["migration"].values()) == 3
    assert (c["newly_solved"], c["broken_solved"], c["preserved_solved"], c["net_solved_gain"]) == (1, 1, 0, 0)
    assert (c["delta_task_solving_rate"], c["mcnemar_p"]) == (0.0, 1.0)
    # 9 requirements; before satisfied 5; repairs 3, regressions 1, changes 4
    assert c["change_rate"] == 44.44
    assert c["repair_probability"] == 75.0
    assert c["regression_risk"] == 20.0
    assert c["positive_change_precision"] == 75.0
    assert c["benefit_risk_ratio"] == 3.75
    assert c["net_requirement_gain"] == 22.22
    # pass fractions before 1, 2/3, 1/4 and after 1/2, 1, 3/4: mean change (-1/2 + 1/3 + 1/2) / 3
    assert c["delta_rubric_pass_rate"] == 11.11


def test_two_runs_without_a_common_task_are_an_error_not_a_comparison_of_nothing():
    other = [row("x1", D, "Science", ["yes"])]
    with pytest.raises(analysis.NoCommonTasks, match="share no task"):
        analysis.compare(BEFORE, other)


def test_rubric_types_and_task_averaged_failure_rates():
    assert analysis.rubric_type("The response should be formatted as exactly three bullet points.") == "format/lexical"
    assert analysis.rubric_type("The response should route the ticket to the Tech agent.") == "procedure/agent"
    assert analysis.rubric_type("The response should compute the weekday average.") == "calc/verify/standards"
    assert analysis.rubric_type("The response should state the badge is exempt unless parked in blue.") == \
        "conditional rules"
    assert analysis.rubric_type("The response should use a friendly tone for a teenager.") == \
        "style/audience/persona"
    assert analysis.rubric_type("The response should be good.") is None
    rows = [
        row("a", D, "x", ["no", "yes", "no"],
            ["Use bullet points.", "Compute the total cost.", "Use a friendly tone."]),
        row("b", D, "x", ["yes", "no"], ["Format the answer as a table.", "Use a heading."]),
    ]
    assert analysis.rubric_type_failure(rows) == {
        "format/lexical": 75.0, "procedure/agent": None, "calc/verify/standards": 0.0,
        "conditional rules": None, "style/audience/persona": 100.0}


def graded_with(early_stop, *rows_):
    """Rows as `grade_file` records them: the grading run's settings in `cg_dspy.run`."""
    return [{**r, "cg_dspy": {"run": {"protocol": "rubric", "votes": 3, "early_stop": early_stop}}} for r in rows_]


FULL_K = graded_with(
    False,
    row("a", D, "x", ["yes", "yes"], votes=[["yes", "yes", "yes"], ["yes", "no", "yes"]]),
    row("c", D, "x", ["no", "yes"], votes=[["no", "no", "no"], ["no", "yes", "yes"]]),
)


def test_judge_stability_from_full_k_votes_matches_hand_counts():
    s = analysis.judge_stability(FULL_K)
    assert s["votes"] == 3
    # requirements: (1 + 1/3 + 1 + 1/3) / 4 pairwise, (1 + 2/3 + 1 + 2/3) / 4 with the majority
    assert s["requirement"] == {"instances": 4, "single_vote_agreement": 66.67, "majority_vote_agreement": 83.33}
    # tasks (all requirements yes per vote): a = [T, F, T], c = [F, F, F]
    assert s["task"] == {"instances": 2, "single_vote_agreement": 66.67, "majority_vote_agreement": 83.33}
    rep = analysis.report({"full": FULL_K})
    assert rep.judge_stability == {"full": s} and rep.judge_stability_reason is None and s["tasks_left_out"] == 0
    assert "judge_stability_reason" not in rep.to_dict()
    assert "### Judge stability: full (K = 3, every vote drawn)" in markdown.to_markdown(rep)


def test_early_stopped_votes_give_no_stability_table_and_say_how_to_measure_it():
    early = graded_with(True, row("a", D, "x", ["yes", "yes"], votes=[["yes", "yes"], ["yes", "no", "yes"]]))
    assert analysis.judge_stability(early) is None  # the one full-K requirement is a disagreeing one
    assert analysis.judge_stability(BEFORE) is None  # no votes at all
    rep = analysis.report({"early": early})
    assert rep.judge_stability is None
    assert "early: the votes were not drawn to K" in rep.judge_stability_reason
    assert "contextguard eval --no-early-stop" in rep.judge_stability_reason
    md = markdown.to_markdown(rep)
    assert "Judge stability: early" not in md and "votes were not drawn to K" in md
    mixed = analysis.report({"early": early, "full": FULL_K})
    assert list(mixed.judge_stability) == ["full"] and "early:" in mixed.judge_stability_reason


def test_rows_that_claim_full_votes_but_lack_some_are_left_out_and_counted():
    short = graded_with(False, row("s", D, "x", ["yes", "no"], votes=[["yes", "yes"], ["no", "no", "no"]]))
    k1 = [{**r, "cg_dspy": {"run": {"votes": 1, "early_stop": False}}}
          for r in [row("o", D, "x", ["yes"], votes=[["yes"]])]]
    five = [{**r, "cg_dspy": {"run": {"votes": 5, "early_stop": False}}}
            for r in [row("f", D, "x", ["yes"], votes=[["yes", "yes", "no", "yes", "yes"]])]]
    assert analysis.judge_stability(short) is None and analysis.judge_stability(k1) is None
    s = analysis.judge_stability(FULL_K + short)
    assert s["requirement"] == analysis.judge_stability(FULL_K)["requirement"] and s["tasks_left_out"] == 1
    mixed = analysis.judge_stability(FULL_K + five)  # one K per table: K = 5, the K = 3 rows left out
    assert (mixed["votes"], mixed["requirement"]["instances"], mixed["tasks_left_out"]) == (5, 1, 2)
    rep = analysis.report({"run": FULL_K + short})
    assert "run (1 tasks left out" in rep.judge_stability_reason
    assert "K = 1 has no second vote" in analysis.report({"one": k1}).judge_stability_reason


def test_report_has_exactly_the_documented_keys():
    report = analysis.report({"before.jsonl": BEFORE, "after.jsonl": AFTER})
    rep = report.to_dict()
    assert set(rep) == {"runs", "comparison", "comparisons", "rubric_typer", "judge_stability",
                        "judge_stability_reason"}
    assert rep["comparisons"] == {"before.jsonl -> after.jsonl": rep["comparison"]}  # a pair, by its two names
    assert report.comparison("before.jsonl", "after.jsonl").paired.tasks == 3
    assert set(rep["runs"]["before.jsonl"]) == {"tasks", "solved", "task_solving_rate", "task_solving_rate_ci95",
                                                "rubric_pass_rate", "rubric_pass_rate_ci95", "by_category",
                                                "by_sub_category", "by_length_bin", "near_miss",
                                                "rubric_type_failure"}
    assert set(rep["comparison"]) == {"delta_task_solving_rate", "delta_task_solving_rate_ci95", "mcnemar_p",
                                      "tasks_compared", "tasks_only_before", "tasks_only_after",
                                      "delta_rubric_pass_rate", "delta_rubric_pass_rate_ci95", "by_length_bin",
                                      "migration", "newly_solved", "broken_solved", "preserved_solved",
                                      "net_solved_gain", "change_rate", "repair_probability", "regression_risk",
                                      "positive_change_precision", "benefit_risk_ratio", "net_requirement_gain"}
    md = markdown.to_markdown(report)
    assert "| before.jsonl | 4 | 1 | 25.00 |" in md and "## before.jsonl -> after.jsonl: migration" in md


@pytest.mark.parametrize("tokens, name", [(0, "0-4K"), (3999, "0-4K"), (4000, "4-8K"), (8000, "8-16K"),
                                          (31999, "16-32K"), (32000, "32K+"), (65000, "32K+")])
def test_length_bins_are_left_closed(tokens, name):
    assert length_bin(tokens) == name


def test_official_graded_sample_reports_true_rate(capsys):
    from cg_dspy.cli import main

    path = shared_file("graded_sample.jsonl")
    assert main(["report", str(path), "--format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    run = rep["runs"]["graded_sample.jsonl"]
    assert (run["tasks"], run["solved"], run["task_solving_rate"]) == (8, 1, 12.5)
    assert run["task_solving_rate_ci95"] == [2.24, 47.09]  # "TSR 12.50" alone hid this
    assert run["near_miss"] == {"0": 1, "1": 3, "2-3": 2, "4-8": 2, ">8": 0}
    assert sum(c["tasks"] for c in run["by_length_bin"].values()) == 8
    assert rep["judge_stability"] is None and "no per-requirement votes" in rep["judge_stability_reason"]


def test_plots_are_written(tmp_path):
    from cg_dspy.reports.render import plots

    written = plots.write_all(analysis.report({"before.jsonl": BEFORE, "after.jsonl": AFTER}), tmp_path)
    assert [p.name for p in written] == ["tsr_by_sub_category.png", "tsr_by_length.png", "near_miss.png",
                                         "rubric_type_failure.png", "migration.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000 for p in written)


def test_two_files_with_one_name_and_one_method_stay_two_runs():
    runs = runs_by_label({"m1/graded.jsonl": BEFORE, "m2/graded.jsonl": AFTER})
    assert list(runs) == ["m1/graded.jsonl", "m2/graded.jsonl"]  # rows without a method: named by path
    same = [{**r, "method": "baseline"} for r in BEFORE]
    runs = runs_by_label({"m1/graded.jsonl": same, "m2/graded.jsonl": same, "x/other.jsonl": same})
    assert list(runs) == ["baseline [m1/graded.jsonl]", "baseline [m2/graded.jsonl]", "baseline [other.jsonl]"]


def test_labels_from_files_cannot_break_the_markdown_tables():
    evil = [{**r, "method": "x|y\n# Injected"} for r in BEFORE]
    md = markdown.to_markdown(analysis.report(runs_by_label({"a.jsonl": evil})))
    assert "\n# Injected" not in md and "x\\|y # Injected" in md


def test_a_sub_category_name_under_two_categories_is_one_row_per_category():
    rows = [row("u1", D, "unknown", ["yes"]), row("u2", R, "unknown", ["no"]), row("s", D, "Science", ["yes"])]
    subs = analysis.run_summary(rows).to_dict()["by_sub_category"]
    one, none = [20.65, 100.0], [0.0, 79.35]  # Wilson's 95% intervals of 1/1 and 0/1: wide, never a division by 0
    assert subs == {"Science": {"tasks": 1, "solved": 1, "task_solving_rate": 100.0, "task_solving_rate_ci95": one,
                                "category": D},
                    f"unknown ({D})": {"tasks": 1, "solved": 1, "task_solving_rate": 100.0,
                                       "task_solving_rate_ci95": one, "category": D},
                    f"unknown ({R})": {"tasks": 1, "solved": 0, "task_solving_rate": 0.0,
                                       "task_solving_rate_ci95": none, "category": R}}
