"""Edit-mode revision: targeted edits applied exactly, unusable ones dropped with their
reason, text outside the edits byte-identical, protected passages refused (on real
CL-bench answers too), a truncated edit list handled; the mode through the test
server, in saved programs and side by side with rewrite in `bench`."""

import json

import pytest
from conftest import DATA, cli, shared_file

from cg_dspy.clbench.store import read_rows
from cg_dspy.method import build_program
from cg_dspy.method.edits import CUT, apply_edits
from cg_dspy.method.schemas import Edit, PlanItem
from cg_dspy.saved import ProgramRefused, load_program
from cg_dspy.testing.server import ChatServer, default_reply

ANSWER = ("Zorvan is not approved for children under 12.\n"
          "Give 20 mg once daily with food.\n"
          "Do not combine with grapefruit juice.")
FIX = [PlanItem(tag="WRONG", text="A dose is given for a 10-year-old."),
       PlanItem(tag="FORMAT-FAIL", text="The closing line is missing.")]
PROTECT = [PlanItem(tag="CONFIRMED-CORRECT", text='States "not approved for children under 12".')]


def edit(fix_item=1, action="replace", target="", text=""):
    return Edit(fix_item=fix_item, action=action, target=target, text=text)


def test_replace_insert_and_append_apply_exactly_and_leave_the_rest_byte_identical():
    edits = [edit(1, "replace", "Give 20 mg once daily with food.", "Give no dose; ask a doctor."),
             edit(1, "insert_after", "under 12.", "He is 10."),
             edit(2, "append", text="Ask your Brightwater pharmacist.")]
    text, report = apply_edits(ANSWER, edits, fix_set=FIX, protect_set=PROTECT)
    assert text == ("Zorvan is not approved for children under 12. He is 10.\n"
                    "Give no dose; ask a doctor.\n"
                    "Do not combine with grapefruit juice.\n\nAsk your Brightwater pharmacist.")
    assert report.applied == [1, 2, 3] and report.dropped == []
    assert text.startswith("Zorvan is not approved for children under 12.")
    assert "\nDo not combine with grapefruit juice." in text  # untouched lines, byte for byte


def test_an_insertion_at_a_replacements_start_comes_first_and_white_space_is_kept():
    edits = [edit(1, "replace", "Give 20 mg", "Give no dose,"), edit(1, "insert_after", "12.\n", "(He is 10.)\n")]
    text, report = apply_edits(ANSWER, edits, fix_set=FIX)
    assert text == ("Zorvan is not approved for children under 12.\n(He is 10.)\nGive no dose, once daily with food.\n"
                    "Do not combine with grapefruit juice.")
    assert report.applied == [1, 2]


@pytest.mark.parametrize("bad, reason", [
    (edit(1, "replace", "Give 40 mg", "x"), "the passage is not in the answer"),
    (edit(1, "replace", "e", "x"), "the passage is in the answer"),
    (edit(1, "insert_after", "grapefruit", ""), "inserts nothing"),
    (edit(3, "append", text="x"), "names no fix-set item (fix_item 3; the fix set has 2)"),
    (edit(None, "append", text="x"), "names no fix-set item"),
    (Edit.model_validate("just some text"), "no action"),
    (Edit.model_validate({"fix_item": "1", "action": "rewrite everything", "text": "x"}), "no action"),
    (edit(1, "replace", "", "x"), "no passage given"),
    (edit(1, "replace", "Give", "Give"), "replaces the passage with itself"),
    (edit(1, "replace", "Zorvan is not approved for children under 12.", "Zorvan is fine."),
     "would change protected content [CONFIRMED-CORRECT]: 12, not approved for children under 12"),
])
def test_an_unusable_edit_is_dropped_with_its_reason_and_the_others_apply(bad, reason):
    good = edit(2, "append", text="Ask your Brightwater pharmacist.")
    text, report = apply_edits(ANSWER, [bad, good], fix_set=FIX, protect_set=PROTECT)
    assert text == ANSWER + "\n\nAsk your Brightwater pharmacist."
    assert report.applied == [2] and [d.edit for d in report.dropped] == [1]
    assert report.dropped[0].reason.startswith(reason), report.dropped[0].reason


def test_overlapping_edits_keep_the_first_and_an_emptied_answer_keeps_the_draft():
    edits = [edit(1, "replace", "Give 20 mg once daily", "Give nothing"),
             edit(1, "replace", "20 mg once daily with food", "no dose"),
             edit(1, "insert_after", "Give 20 mg", " (not for him)")]
    text, report = apply_edits(ANSWER, edits, fix_set=FIX)
    assert text == ANSWER.replace("Give 20 mg once daily", "Give nothing")
    assert [(d.edit, d.reason) for d in report.dropped] == [(2, "overlaps edit 1"), (3, "overlaps edit 1")]
    everything = [edit(1, "replace", ANSWER, "")]
    text, report = apply_edits(ANSWER, everything, fix_set=FIX)
    assert text == ANSWER and report.applied == []
    assert report.dropped[0].reason == "together the edits would empty the answer"


def test_a_cut_edit_list_applies_its_complete_edits_and_drops_the_last():
    edits = [edit(2, "append", text="Ask your Brightwater pharmacist."), edit(1, "replace", "Give 20 mg", "Gi")]
    text, report = apply_edits(ANSWER, edits, fix_set=FIX, truncated=True)
    assert text == ANSWER + "\n\nAsk your Brightwater pharmacist."
    assert [(d.edit, d.reason) for d in report.dropped] == [(2, CUT)]


def test_a_long_passage_is_replaced_whole_and_a_replace_without_text_deletes_nothing():
    long = "word " * 1000
    answer = "START " + long + "END"
    text, report = apply_edits(answer, [edit(1, "replace", long, "SHORT ")], fix_set=FIX)
    assert text == "START SHORT END" and report.applied == [1]  # never clipped, so never half-replaced
    unnamed = Edit.model_validate({"fix_item": 1, "action": "replace", "target": "Give 20 mg once daily with food.",
                                   "replacement": "Give 10 mg."})
    text, report = apply_edits(ANSWER, [unnamed], fix_set=FIX)
    assert text == ANSWER and report.dropped[0].reason.startswith("no text given")
    text, _ = apply_edits(ANSWER, [edit(1, "replace", "\nDo not combine with grapefruit juice.", "")], fix_set=FIX)
    assert text == ANSWER.rsplit("\n", 1)[0]  # an empty text is a deletion, said on purpose


def test_protection_is_judged_on_the_whole_answer_whole_numbers_and_phrases_an_insertion_would_split():
    small = [PlanItem(tag="CONFIRMED-CORRECT", text="Take 2 tablets at night.")]
    answer = "Take 2 tablets at night. Dose 20 mg."
    text, report = apply_edits(answer, [edit(1, "replace", "Dose 20 mg.", "Dose 10 mg.")], fix_set=FIX,
                               protect_set=small)
    assert text == "Take 2 tablets at night. Dose 10 mg." and report.applied == [1]  # the protected "2" stays
    split = [edit(2, "append", text="Ask your pharmacist."), edit(1, "insert_after", "Zorvan is not", "yet")]
    text, report = apply_edits(ANSWER, split, fix_set=FIX, protect_set=PROTECT)
    assert text == ANSWER + "\n\nAsk your pharmacist." and report.applied == [1]
    assert report.dropped[0].reason.startswith("would change protected content [CONFIRMED-CORRECT]")


def test_the_edit_schema_requires_every_field_and_leaves_passages_unbounded_for_grammars():
    from pydantic import TypeAdapter

    from cg_dspy.lms.embedded import UNBOUNDED, bound_schema
    from cg_dspy.method.schemas import EditItems

    schema = bound_schema({"type": "object", "properties": {"edits": TypeAdapter(EditItems).json_schema()}},
                          max_items=24, max_chars=500)
    item = schema["properties"]["edits"]["$defs"]["Edit"]
    assert item["required"] == ["fix_item", "action", "target", "text"]
    assert "maxLength" not in json.dumps(item["properties"]) and UNBOUNDED not in json.dumps(schema)
    assert schema["properties"]["edits"]["maxItems"] == 24


def _lines(answer: str) -> list[str]:
    """Lines of a real answer an edit can name: unique, long enough, no double quote."""
    return [line for line in dict.fromkeys(answer.splitlines())
            if len(line) >= 30 and '"' not in line and answer.count(line) == 1]


def test_on_real_clbench_answers_a_protected_passage_is_refused_and_another_is_edited():
    rows = [json.loads(line) for line in shared_file("graded_sample.jsonl").read_text().splitlines()]
    checked = 0
    for row in rows:
        answer, lines = row["model_output"], _lines(row["model_output"])
        if len(lines) < 2:
            continue
        keep, change = lines[0], lines[-1]
        quoted = keep[:100].rsplit(" ", 1)[0]
        protect = [PlanItem(tag="CONFIRMED-CORRECT", text=f'Keeps "{quoted}" as it is.')]
        fix = [PlanItem(tag="MISSED", text="One point is thin.")]
        edits = [edit(1, "replace", keep, "A shorter line."), edit(1, "replace", change, change + " (expanded)")]
        text, report = apply_edits(answer, edits, fix_set=fix, protect_set=protect)
        assert report.applied == [2], (row["idx"], report)
        assert report.dropped[0].reason.startswith("would change protected content [CONFIRMED-CORRECT]")
        start = answer.index(change)
        assert text == answer[:start] + change + " (expanded)" + answer[start + len(change):]
        checked += 1
    assert checked >= 5  # most of the 8 real answers have two such lines


# --- through the program and the test server -------------------------------------------

DRAFT = "Zorvan is not approved for children under 12. Give 20 mg once daily. Ask your pharmacist."


def scripted(edits):
    """A server reply: the draft, an audit finding one missed and one wrong item with one
    confirmed, `edits` for the edit stage, the default for anything else."""
    def reply(messages):
        last = messages[-1]["content"]
        if '- "confirmed_correct"' in last:
            return json.dumps({"confirmed_correct": [{"text": 'States "not approved for children under 12".'}],
                               "confirmed_data": [], "possibly_wrong": [{"text": "A dose is given for a child."}],
                               "possibly_missed": [{"text": "The closing line is missing."}]})
        if '- "edits"' in last:
            return json.dumps({"edits": edits}) if isinstance(edits, list) else edits
        if '- "' in last or "satisfaction_status" in last:
            return default_reply(messages)
        return DRAFT
    return reply


def run_demo(tmp_path, reply, *more, name="o.jsonl"):
    out = tmp_path / name
    with ChatServer(reply=reply) as server:
        r = cli("run", DATA / "demo.jsonl", "--out", out, "--revision-mode", "edit", "--model", "openai/t",
                "--api-base", server.base_url, "--no-cache", "--quiet", "--no-track", *more)
        bodies = list(server.requests)
    assert r.returncode == 0, r.stderr
    return {row["idx"]: row for row in read_rows(out)}, bodies


def test_edit_mode_through_the_server_applies_the_edits_and_records_each(tmp_path):
    edits = [{"fix_item": 1, "action": "replace", "target": "Give 20 mg once daily.", "text": "Give no dose."},
             {"fix_item": 2, "action": "append", "text": "Ask your Brightwater pharmacist."},
             {"fix_item": 1, "action": "replace", "target": "not approved for children under 12",
              "text": "approved"},
             {"fix_item": 1, "action": "replace", "target": "Give 40 mg", "text": "x"}]
    rows, bodies = run_demo(tmp_path, scripted(edits))
    assert len(rows) == 4
    for row in rows.values():
        trace = row["trace"]
        assert trace["path"] == "revised" and trace["draft"] == DRAFT
        assert row["model_output"] == ("Zorvan is not approved for children under 12. Give no dose. Ask your "
                                       "pharmacist.\n\nAsk your Brightwater pharmacist.")
        assert trace["edits"]["applied"] == [1, 2]
        assert [d["edit"] for d in trace["edits"]["dropped"]] == [3, 4]
        assert "protected content" in trace["edits"]["dropped"][0]["reason"]
        assert trace["cost"]["edit"]["calls"] == 1 and "revise" not in trace["cost"]
    asked = [b["messages"][-1]["content"] for b in bodies if '- "edits"' in b["messages"][-1]["content"]]
    numbered = "1. [MISSED] The closing line is missing.\n2. [WRONG] A dose is given for a child."
    assert len(asked) == 4 and all(numbered in a for a in asked)  # each edit can name its item


def test_no_usable_edit_keeps_the_draft_on_the_no_edit_path(tmp_path):
    rows, _ = run_demo(tmp_path, scripted([{"fix_item": 1, "action": "replace", "target": "absent", "text": "x"}]))
    assert {row["trace"]["path"] for row in rows.values()} == {"no-edit"}
    assert all(row["model_output"] == DRAFT for row in rows.values())


def test_an_edit_list_cut_at_max_tokens_applies_its_complete_edits(tmp_path):
    complete = {"fix_item": 2, "action": "append", "text": "Ask your Brightwater pharmacist."}
    long = {"fix_item": 1, "action": "replace", "target": "Give 20 mg once daily.",
            "text": " ".join(["Give no dose at all to a child of ten."] * 40)}
    reply = json.dumps({"edits": [complete, long]})
    rows, _ = run_demo(tmp_path, scripted(reply), "--max-tokens", "60")
    for row in rows.values():
        trace = row["trace"]
        assert trace["cost"]["edit"]["truncated"] >= 1
        assert row["model_output"] == DRAFT + "\n\nAsk your Brightwater pharmacist.", trace.get("failures")
        assert trace["edits"]["applied"] == [1] and trace["edits"]["dropped"][-1]["reason"] == CUT


def test_a_saved_edit_mode_program_keeps_its_mode_and_its_own_prompt(tmp_path):
    program = build_program("contextguard-edit")
    program.edit.signature = program.edit.signature.with_instructions("Edit tersely.")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(program.dump_state()))
    loaded = load_program(path)
    assert loaded.revision_mode == "edit" and loaded.edit.signature.instructions == "Edit tersely."
    assert loaded.config()["revision_mode"] == "edit"
    assert "revision_mode" not in build_program("contextguard").config()  # rewrite programs are as before
    assert not hasattr(build_program("contextguard"), "edit")
    assert "revise" not in dict(program.named_predictors())  # the stage edit mode never runs is not there
    state = {**program.dump_state(), "revise": build_program("contextguard").dump_state()["revise"]}
    path.write_text(json.dumps(state))
    with pytest.raises(ProgramRefused, match="'revise' is not a stage of this program"):
        load_program(path)


def test_bench_runs_rewrite_and_edit_on_the_same_drafts_and_pairs_them(tmp_path):
    edits = [{"fix_item": 2, "action": "append", "text": "Ask your Brightwater pharmacist."}]
    with ChatServer(reply=scripted(edits)) as server:
        r = cli("bench", DATA / "demo.jsonl", "--methods", "contextguard,contextguard-edit", "--out-dir",
                tmp_path / "b", "--model", "openai/t", "--api-base", server.base_url, "--judge-model", "openai/j",
                "--judge-api-base", server.base_url, "--votes", "1", "--no-cache", "--quiet", "--no-track")
    assert r.returncode == 0, r.stderr
    rewrite = {x["idx"]: x for x in read_rows(tmp_path / "b" / "contextguard.jsonl")}
    edited = {x["idx"]: x for x in read_rows(tmp_path / "b" / "contextguard-edit.jsonl")}
    assert set(edited) == set(rewrite) and all(edited[i]["trace"]["draft"] == rewrite[i]["trace"]["draft"]
                                               for i in edited)
    assert all("draft" not in x["trace"]["cost"] for x in edited.values())  # the drafts were reused
    report = json.loads((tmp_path / "b" / "report.json").read_text())
    assert set(report["runs"]) == {"contextguard", "contextguard (edit)"}
    (pair,) = report["comparisons"].items()  # paired on the same drafts: interval and McNemar test
    assert pair[0] == "contextguard -> contextguard (edit)" and pair[1]["tasks_compared"] == 4
    assert len(pair[1]["delta_task_solving_rate_ci95"]) == 2 and "mcnemar_p" in pair[1]
    assert "| contextguard -> contextguard (edit) | 4 |" in r.stdout


def test_an_edit_mode_optimize_tunes_the_edit_stage_and_registers_it_as_its_own_prompt(store):
    import mlflow
    from conftest import tracked_optimize, untracked_optimize
    from scripted import scripted_lm
    from test_optimize import behaviour, by_ids

    def with_edits(stage, messages):
        if stage == "edit":
            return {"edits": [{"fix_item": 1, "action": "append", "text": "IMPROVED"}]}
        if stage == "audit":  # every draft has something to fix, so every task reaches the revision
            return {**behaviour(stage, messages), "possibly_missed": [{"text": "add the word IMPROVED"}]}
        return behaviour(stage, messages)

    lm, engine = scripted_lm(with_edits)
    result = tracked_optimize(store, optimizer="bootstrap", train=by_ids("dk-01", "dk-02"),
                              dev=by_ids("dk-03", "dk-04"), task_lm=lm, judge_lm=lm, budget="light", threads=2,
                              revision_mode="edit")
    assert "edit" in result.settings["tunable"] and "revise" not in result.settings["tunable"]
    assert result.settings["program"]["revision_mode"] == "edit" and result.program.revision_mode == "edit"
    assert "edit" in engine.stages() and "revise" not in engine.stages()
    prompt = mlflow.genai.load_prompt("prompts:/contextguard.edit/1")
    assert "targeted edits" in prompt.template
    with pytest.raises(ValueError, match=r"tunable stages \['revise'\] do not exist"):
        untracked_optimize(optimizer="bootstrap", train=by_ids("dk-01"), dev=by_ids("dk-03"), task_lm=lm,
                           judge_lm=lm, revision_mode="edit", tunable=("audit", "revise"))


def test_gepa_feedback_for_the_edit_stage_names_the_edits_that_did_not_apply():
    import dspy

    from cg_dspy.judge.metric import explain

    text, report = apply_edits(ANSWER, [edit(1, "replace", "Give 40 mg", "x"), edit(2, "append", text="Bye.")],
                               fix_set=FIX)
    prediction = dspy.Prediction(answer=text, draft=ANSWER, path="revised", edits=report, fix_set=FIX, protect_set=[])
    feedback = explain(["The response should end with Bye."], [False], prediction, "edit", draft=[False])
    assert "1 of 2 edit(s) could not be applied:\n- edit 1: the passage is not in the answer" in feedback
    assert "Path taken: revised." in feedback


def test_a_cut_first_reply_asked_again_does_not_cost_the_retrys_last_edit(tmp_path):
    good = [{"fix_item": 2, "action": "append", "text": "Ask your Brightwater pharmacist."},
            {"fix_item": 1, "action": "replace", "target": "Give 20 mg once daily.", "text": "Give no dose."}]
    base, seen = scripted(good), set()

    def reply(messages):  # the first ask of each edit stage rambles past max_tokens, the retry answers
        if '- "edits"' in messages[-1]["content"] and json.dumps(messages) not in seen:
            seen.add(json.dumps(messages))
            return "I will now think about the edits " * 30
        return base(messages)

    rows, _ = run_demo(tmp_path, reply, "--max-tokens", "60")
    for row in rows.values():
        trace = row["trace"]
        assert trace["cost"]["edit"]["calls"] == 2 and trace["cost"]["edit"]["truncated"] == 1
        assert trace["edits"]["applied"] == [1, 2] and trace["edits"]["dropped"] == []
        assert row["model_output"] == ("Zorvan is not approved for children under 12. Give no dose. Ask your "
                                       "pharmacist.\n\nAsk your Brightwater pharmacist.")


@pytest.mark.parametrize("where", ["self-refine", "saved program"])
def test_edit_mode_is_refused_where_it_would_be_ignored(tmp_path, where):
    saved = tmp_path / "p.json"
    saved.write_text(json.dumps(build_program("contextguard").dump_state()))
    extra = ["--method", "self-refine"] if where == "self-refine" else ["--program", saved]
    with ChatServer() as server:
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", "--revision-mode", "edit", *extra,
                "--model", "openai/t", "--api-base", server.base_url, "--no-track")
        assert server.requests == []
    assert r.returncode == 2 and "revision" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o.jsonl").exists()
