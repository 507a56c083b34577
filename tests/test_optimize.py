"""Compile with real DSPy optimizers (scripted LM), track in a real MLflow store, load back."""

import json
import sqlite3

import pytest
from conftest import DATA, tracked_optimize, untracked_optimize
from scripted import scripted_lm

from cg_dspy import ContextGuard, optimize
from cg_dspy.clbench.data import load_tasks
from cg_dspy.lms import using
from cg_dspy.reports.render import markdown
from cg_dspy.saved import load_program

RULE = "NEW-AUDIT-RULE: flag every requirement the answer does not yet meet."


def behaviour(stage, messages):
    """Answers improve only when the audit instruction carries RULE (what GEPA should find)."""
    last = messages[-1]["content"]
    if stage in ("draft", "generate"):
        return "- Theo has 6 life\n- Rules: R3, R4"
    if stage == "audit":
        missed = [{"text": "add the word IMPROVED", "issue_type": None}] if "NEW-AUDIT-RULE" in last else []
        return {"confirmed_correct": [{"text": "Theo has 6 life", "issue_type": None}], "confirmed_data": [],
                "possibly_missed": missed, "possibly_wrong": []}
    if stage in ("format", "procedure"):
        return {"format_ok": [], "format_fail": [], "proc_ok": [], "proc_fail": []}
    if stage == "revise":
        return "- Theo has 6 life\n- Rules: R3, R4\n- IMPROVED"
    if stage == "judge":
        response, requirement = last.split("[[ ## requirement ## ]]")
        ok = "IMPROVED" in response or "the response should be" in requirement.lower()
        return {"reason": "checked", "satisfaction_status": "yes" if ok else "no"}
    if stage == "propose":  # GEPA's reflection LM proposes a new instruction
        return {"new_instruction": RULE}
    return {}


@pytest.fixture
def splits():
    tasks = load_tasks(DATA / "tasks.jsonl").tasks
    return tasks[:4], tasks[4:7]


def by_ids(*ids):
    tasks = {t.idx: t for t in load_tasks(DATA / "tasks.jsonl").tasks}
    return [tasks[i] for i in ids]


def run_params(run_id):
    import mlflow

    return mlflow.get_run(run_id)


def test_bootstrap_compile_logs_run_and_program_loads_from_file_and_mlflow(store, splits, tmp_path):
    lm, engine = scripted_lm(behaviour)
    out = tmp_path / "program.json"
    result = tracked_optimize(store, optimizer="bootstrap", train=splits[0], dev=splits[1], task_lm=lm, judge_lm=lm,
                              budget="light", threads=2, out=out, params={"task_lm": {"model": "scripted/test"}},
                              trace=True)
    compiled = result.program
    assert [len(p.demos) for n, p in compiled.named_predictors() if n == "audit"] == [1]
    assert all(not p.demos for n, p in compiled.named_predictors() if n not in ("audit", "revise"))

    run = run_params(result.run_id)
    assert run.data.params["optimizer"] == "bootstrap" and run.data.params["budget"] == "light"
    assert run.data.params["train_size"] == "4" and run.data.params["dev_size"] == "3"
    assert run.data.params["task_lm.model"] == "scripted/test" and run.data.params["tunable"] == \
        '["audit", "audit_rules", "audit_empirical", "revise"]'
    assert run.data.metrics["dev.task_solving_rate"] == result.dev_after["task_solving_rate"]
    assert "dev_before.rubric_pass_rate" in run.data.metrics
    import mlflow

    # DSPy's own traces of the program calls the optimizer made, in this run
    traces = mlflow.search_traces(run_id=result.run_id, return_type="list")
    assert len(traces) >= len(splits[1]) and all(t.data.spans for t in traces)

    files = {a.path for a in mlflow.artifacts.list_artifacts(run_id=result.run_id)}
    assert {"program.json", "prompts"} <= files  # the MLflow model is a LoggedModel, loaded below
    prompt_files = {a.path for a in mlflow.artifacts.list_artifacts(run_id=result.run_id, artifact_path="prompts")}
    assert {"prompts/audit.demos.json", "prompts/revise.demos.json"} <= prompt_files  # beside the registry

    task = splits[1][0]
    for loaded in (load_program(out), load_program(f"runs:/{result.run_id}")):
        assert {n: p.signature.instructions for n, p in loaded.named_predictors()} == \
               {n: p.signature.instructions for n, p in compiled.named_predictors()}
        assert len(loaded.audit.demos) == 1
        with using(lm):
            a = compiled(conversation=task.messages, category=task.category)
            b = loaded(conversation=task.messages, category=task.category)
        assert (a.answer, a.path, a.fix_set) == (b.answer, b.path, b.fix_set)
        audit_prompts = [c.messages[-1]["content"] for c in engine.calls[-4:] if c.stage == "audit"]
        assert audit_prompts[0] == audit_prompts[1]  # the demo reaches the prompt identically

    import mlflow.dspy

    pickled = mlflow.dspy.load_model(f"runs:/{result.run_id}/model")  # MLflow's own loader, not ours
    mlflow.clear_active_model()  # loading makes the model "active" for later runs' metrics
    with using(lm):
        assert pickled(conversation=task.messages, category=task.category).answer == a.answer
    with pytest.raises(ValueError, match="a saved program is a .json artifact"):
        load_program(f"runs:/{result.run_id}/model")  # ours reads only JSON state


def test_gepa_finds_the_better_audit_instruction_and_compare_shows_the_diff(store, capsys):
    lm, _ = scripted_lm(behaviour)
    train, dev = by_ids("dk-01", "dk-02"), by_ids("dk-03", "dk-04")  # the generic audit serves these
    base = tracked_optimize(store, optimizer="bootstrap", train=train, dev=dev, task_lm=lm, judge_lm=lm,
                            budget="light", threads=2)
    result = tracked_optimize(store, optimizer="gepa", train=train, dev=dev, task_lm=lm, judge_lm=lm,
                              reflection_lm=lm, budget="light", threads=2, alias="best")
    assert result.program.audit.signature.instructions == RULE  # the proposal itself, not its JSON envelope
    assert result.dev_before["task_solving_rate"] == 0.0 and result.dev_after["task_solving_rate"] == 100.0
    assert result.program.draft.signature.instructions == base.program.draft.signature.instructions

    from cg_dspy.cli import main

    capsys.readouterr()  # drop what the optimizers printed
    assert main(["compare", "--experiment", "cg-test", "--tracking-uri", store, "--format", "json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    audit = cmp["stages"]["audit"]
    assert [v["variant"] for v in audit["versions"]] == ["base", "tuned", "tuned"]
    assert [v["optimizer"] for v in audit["versions"]] == ["", "bootstrap", "gepa"]
    assert [v["dev_after"] for v in audit["versions"]] == [None, 0.0, 100.0] and audit["b"] == 3  # best by dev
    # each version against the untuned program on the same 2 dev tasks: 0 -> 2 solved, paired
    gepa = audit["versions"][2]
    assert (gepa["dev_tasks"], gepa["dev_delta"], gepa["dev_mcnemar_p"]) == (2, 100.0, 0.5)
    assert gepa["dev_delta_ci95"] == result.dev_change["delta_task_solving_rate_ci95"]
    assert gepa["dev_delta_ci95"][0] < 100.0 and gepa["dev_after_ci95"] == [34.24, 100.0]  # Wilson of 2/2
    assert f"+{RULE}" in audit["instructions_diff"] and audit["demos_diff"] == ""
    assert "draft" not in cmp["stages"]  # never tuned: one version only
    boot = main(["compare", "--experiment", "cg-test", "--tracking-uri", store, "--stage", "audit", "--a", "1",
                 "--b", "2", "--format", "json"])
    assert boot == 0
    demos = json.loads(capsys.readouterr().out)["stages"]["audit"]["demos_diff"]
    assert demos.startswith("--- v1 demos") and '+  "previous_answer"' in demos  # bootstrap added a demo
    optimize_rows = cmp["runs"]["optimize"]
    assert [r["run_id"] for r in optimize_rows] == [base.run_id[:8], result.run_id[:8]]
    assert [r["dev.task_solving_rate"] for r in optimize_rows] == [0.0, 100.0]
    assert all(len(row) <= 8 for row in optimize_rows)  # a compact table, not every param
    assert main(["compare", "--experiment", "cg-test", "--tracking-uri", store]) == 0
    text = capsys.readouterr().out
    assert "NEW-AUDIT-RULE" in text and "| version |" in text
    assert f"| 100.00 [34.24, 100.00] | +100.00 {markdown.interval(gepa['dev_delta_ci95'])} | 0.500 |" in text

    program = load_program("prompts:/contextguard@best")  # a program from the registry
    assert program.audit.signature.instructions == RULE
    assert program.revise.signature.instructions == result.program.revise.signature.instructions


def test_gepa_rewrites_the_integrated_rule_fidelity_criteria_and_the_saved_program_holds_them(store, tmp_path):
    lm, _ = scripted_lm(behaviour)
    out = tmp_path / "program.json"
    default = optimize.DEFAULT_TUNABLE
    assert {"audit", "audit_rules", "audit_empirical", "revise"} == set(default)
    result = untracked_optimize(optimizer="gepa", train=by_ids("rs-01", "rs-02"), dev=by_ids("rs-03"), task_lm=lm,
                                judge_lm=lm, reflection_lm=lm, budget="light", threads=2, tunable=("audit_rules",),
                                out=out)
    assert result.program.audit_rules.signature.instructions == RULE  # the rulebook criteria were rewritten
    assert result.dev_before["task_solving_rate"] == 0.0 and result.dev_after["task_solving_rate"] == 100.0
    saved = json.loads(out.read_text())
    assert saved["audit_rules"]["signature"]["instructions"] == RULE
    assert "rulebook" in ContextGuard().audit_rules.signature.instructions  # what it was before tuning
    loaded = load_program(out)
    assert loaded.audit_rules.signature.instructions == RULE
    assert loaded.audit.signature.instructions == result.program.audit.signature.instructions != RULE


def test_api_key_never_reaches_the_store(store, splits, tmp_path, monkeypatch):
    secret = "sk-test-5ecret-abcdef123456"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    lm, _ = scripted_lm(behaviour)
    tracked_optimize(store, optimizer="bootstrap", train=splits[0][:2], dev=splits[1][:1], task_lm=lm, judge_lm=lm,
                     budget="light", threads=1, out=tmp_path / "p.json",
                     params={"task_lm": {"model": "openai/x", "api_key": secret}, "note": f"key={secret}"})
    hits = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert hits == []
    rows = sqlite3.connect(tmp_path / "mlflow.db").execute("select key, value from params").fetchall()
    assert ("note", "key=***") in rows and not any(k == "task_lm.api_key" and v != "***" for k, v in rows)
    run_id = sqlite3.connect(tmp_path / "mlflow.db").execute("select run_uuid from runs").fetchone()[0]
    import mlflow

    assert mlflow.search_traces(run_id=run_id, return_type="list") == []  # tracing off: no autolog traces either


@pytest.mark.parametrize("dead", ["task", "judge"])
def test_optimize_stops_before_compiling_when_no_dev_task_answers(store, tmp_path, dead):
    """An unreachable task LM or judge: one clear line and a failed exit, not a 'compiled'
    program whose dev scores are 0 -> 0 and whose prompt versions are untouched copies."""
    import socket

    import mlflow
    from conftest import cli

    from cg_dspy.testing.server import ChatServer

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    manifest = DATA / "splits" / "tasks.json"
    with ChatServer() as server:
        task, judge = (nobody, server.base_url) if dead == "task" else (server.base_url, nobody)
        done = cli("optimize", "--optimizer", "bootstrap", "--train", f"{manifest}#train", "--dev",
                   f"{manifest}#dev", "--out", str(tmp_path / "p.json"), "--model", "openai/x", "--api-base", task,
                   "--judge-model", "openai/j", "--judge-api-base", judge, "--no-cache", "--retries", "0",
                   "--timeout", "2", "--tracking-uri", store, "--experiment", "cg-test")
    assert done.returncode == 1, done.stderr
    assert "every dev task (5) failed before compiling" in done.stderr and "Connection refused" in done.stderr
    assert f"[openai/{'x' if dead == 'task' else 'j'}]" in done.stderr  # names which LM did not answer
    assert not (tmp_path / "p.json").exists()
    assert [r.info.status for r in mlflow.search_runs(experiment_names=["cg-test"], output_format="list")] == ["FAILED"]
    assert mlflow.genai.search_prompts() == []


def test_optimize_exits_failed_when_some_dev_tasks_error(store, tmp_path):
    """A dev task the LM never answers scores 0 like a wrong answer would: the run says so
    and exits 1, so a script does not take its dev scores at face value."""
    from conftest import cli

    from cg_dspy.testing.server import ChatServer

    manifest = DATA / "splits" / "tasks.json"
    with ChatServer() as server:
        server.inject("status", status=500, match="Pondworld", times=10_000)  # dev task ed-03, every call
        done = cli("optimize", "--optimizer", "bootstrap", "--train", f"{manifest}#train", "--dev",
                   f"{manifest}#dev", "--out", str(tmp_path / "p.json"), "--model", "openai/x", "--api-base",
                   server.base_url, "--judge-model", "openai/x", "--judge-api-base", server.base_url, "--no-cache",
                   "--retries", "0", "--no-track")
    assert done.returncode == 1, done.stderr
    assert "1 dev task(s) failed with an error before compiling" in done.stderr
    assert max(map(len, done.stderr.splitlines())) < 1000  # DSPy's log of a failed example, without its context
    out = json.loads(done.stdout)  # stdout is the JSON alone (the optimizer's progress goes to stderr)
    assert out["dev_before"]["errors"] == out["dev_after"]["errors"] == 1 and (tmp_path / "p.json").exists()
