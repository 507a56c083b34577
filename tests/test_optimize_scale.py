"""Optimization at real scale: the estimate before spending, the cap, the paper's judge on
dev, a held-out test, feedback for every tuned stage, and what a run shows while it runs.
Runs against the test server serving a plausible model (replies that cost what a real
model's do), so the calls counted are requests a server received."""

import json

import mlflow
import pytest
from conftest import DATA, cli, tracked_optimize, untracked_optimize
from scripted import scripted_lm

from cg_dspy.clbench.data import load_tasks
from cg_dspy.lms import LMSettings, build_lm
from cg_dspy.optimize import simulate
from cg_dspy.testing.server import ChatServer, Realistic

TASKS = {t.idx: t for t in load_tasks(DATA / "tasks.jsonl").tasks}
TRAIN, DEV = [TASKS[i] for i in ("dk-01", "rs-01", "pt-01")], [TASKS[i] for i in ("dk-02", "rs-02")]


def lms(server):
    task = build_lm(LMSettings(model="openai/test-model", api_base=server.base_url))
    judge = build_lm(LMSettings(model="openai/test-model", api_base=server.base_url), default_temperature=0.6)
    return task, judge


@pytest.mark.parametrize("optimizer", ["bootstrap", "mipro", "gepa", "simba"])
def test_the_estimate_is_within_35_percent_of_what_the_run_sends(optimizer):
    for budget in ("light", "medium"):
        with ChatServer(reply=Realistic("another plausible model")) as server:
            task, judge = lms(server)
            options = dict(optimizer=optimizer, train=TRAIN, dev=DEV, budget=budget, task_lm=task, judge_lm=judge,
                           threads=2)
            estimate = simulate.estimate(**options)
            assert server.requests == []  # the estimate sends nothing
            result = untracked_optimize(**options, dev_votes=3)
            sent = len(server.requests)
        assert result.calls["total"] == sent, (optimizer, budget)  # the count is what the server received
        assert abs(estimate["calls"]["total"] - sent) <= 0.35 * sent, (optimizer, budget, estimate["calls"], sent)
        assert estimate["calls"]["judge"] > 0 and estimate["prompt_tokens"]["total"] > 0


def test_against_the_model_it_assumes_the_estimate_is_exact():
    with ChatServer(reply=Realistic()) as server:  # the plausible model the estimate plays
        task, judge = lms(server)
        options = dict(optimizer="gepa", train=TRAIN, dev=DEV, budget="light", task_lm=task, judge_lm=judge, threads=1)
        estimate = simulate.estimate(**options)
        untracked_optimize(**options, dev_votes=3)
        assert estimate["calls"]["total"] == len(server.requests)


def test_dev_is_judged_with_three_votes_and_the_test_split_scores_each_program_once(tmp_path):
    test = [TASKS["ed-01"], TASKS["pt-02"]]
    with ChatServer() as server:  # its judge always agrees: early stop decides after 2 votes
        task, judge = lms(server)
        task, judge = task.copy(cache=False), judge.copy(cache=False)
        result = untracked_optimize(optimizer="bootstrap", train=TRAIN, dev=DEV, test=test, budget="light",
                                    task_lm=task, judge_lm=judge, threads=2, dev_votes=3)
        judged = [json.dumps(b["messages"]) for b in server.requests if "satisfaction_status" in json.dumps(b)]
        drafts = [b for b in server.requests if "satisfaction_status" not in json.dumps(b)
                  and b["messages"][-1]["content"].startswith(test[0].messages[-1].content[:60])
                  and len(b["messages"]) == len(test[0].messages)]
    assert judged and all(judged.count(j) == 2 for j in set(judged))  # K = 3, decided after 2 agreeing votes
    assert len(drafts) == 2  # the test task's reminder draft: once per program, untuned and tuned
    assert result.test["scored"] and result.test["tasks"] == 2
    assert set(result.test["change"]) >= {"delta_task_solving_rate", "delta_task_solving_rate_ci95", "mcnemar_p"}


def test_max_calls_stops_the_run_keeps_the_best_program_and_it_runs(tmp_path):
    manifest, out = tmp_path / "s.json", tmp_path / "p.json"
    assert cli("split", str(DATA / "tasks.jsonl"), "--out", str(manifest), "--fractions", "0.4,0.3,0.3").returncode == 0
    with ChatServer(reply=Realistic()) as server:
        lm = ["--model", "openai/test-model", "--api-base", server.base_url, "--judge-model", "openai/test-model",
              "--judge-api-base", server.base_url, "--quiet", "--threads", "2"]
        r = cli("optimize", "--optimizer", "gepa", "--train", f"{manifest}#train", "--dev", f"{manifest}#dev",
                "--out", str(out), "--max-calls", "120", *lm, "--tracking-uri", f"sqlite:///{tmp_path}/m.db")
        assert r.returncode == 3, r.stderr
        sent = len(server.requests)
        report = json.loads(r.stdout)
        assert report["capped"] and report["calls"]["total"] == sent <= 120  # not one call past the cap
        assert "stopped at --max-calls 120" in r.stderr and report["estimate"]["calls"]["total"] > 120
        r = cli("run", str(DATA / "demo.jsonl"), "--program", str(out), "--out", str(tmp_path / "o.jsonl"),
                "--model", "openai/test-model", "--api-base", server.base_url, "--quiet", "--no-track")
        assert r.returncode == 0, r.stderr  # the saved program runs
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/m.db")
    run = mlflow.search_runs(experiment_names=["contextguard"], output_format="list")[0]
    assert run.data.metrics["capped"] == 1 and run.data.metrics["calls.total"] == sent
    versions = mlflow.MlflowClient().search_prompt_versions("contextguard.audit")
    assert any((v.tags or {}).get("capped") == "true" for v in versions)


def test_dry_run_prints_the_estimate_and_calls_and_writes_nothing(tmp_path):
    manifest = tmp_path / "s.json"
    assert cli("split", str(DATA / "tasks.jsonl"), "--out", str(manifest), "--fractions", "0.4,0.3,0.3").returncode == 0
    with ChatServer() as server:
        lm = ["--model", "openai/test-model", "--api-base", server.base_url, "--judge-model", "openai/test-model",
              "--judge-api-base", server.base_url, "--quiet"]
        r = cli("optimize", "--optimizer", "simba", "--train", f"{manifest}#train", "--dev", f"{manifest}#dev",
                "--test", f"{manifest}#test", "--out", str(tmp_path / "p.json"), "--dry-run", *lm)
        assert r.returncode == 0, r.stderr
        assert server.requests == [] and not (tmp_path / "p.json").exists() and not (tmp_path / "mlflow.db").exists()
    estimate = json.loads(r.stdout)["estimate"]
    assert estimate["calls"]["total"] == sum(estimate["calls"][k] for k in ("task", "judge", "reflection")) > 0
    assert estimate["prompt_tokens"]["total"] > 0 and estimate["assumptions"]


@pytest.mark.parametrize("flags, says", [
    (["--max-calls", "0"], "at least 1"),
    (["--dev-votes", "2"], "tie"),
    (["--test", "{manifest}#dev"], "share task(s)"),
    (["--train", "missing.jsonl"], "no such task file"),
])
def test_bad_optimize_input_is_refused_before_anything(tmp_path, flags, says):
    manifest = tmp_path / "s.json"
    assert cli("split", str(DATA / "tasks.jsonl"), "--out", str(manifest), "--fractions", "0.4,0.3,0.3").returncode == 0
    args = {"--train": f"{manifest}#train", "--dev": f"{manifest}#dev"}
    extra = [f.format(manifest=manifest) for f in flags]
    for flag in ("--train", "--dev"):
        if flag not in extra:
            extra += [flag, args[flag]]
    with ChatServer() as server:
        r = cli("optimize", "--optimizer", "bootstrap", "--out", str(tmp_path / "p.json"), "--dry-run", *extra,
                "--model", "openai/test-model", "--api-base", server.base_url)
        assert r.returncode == 2 and says in r.stderr and server.requests == [], r.stderr
    assert not (tmp_path / "p.json").exists()


# --- feedback for every tuned stage ---------------------------------------------------------

RULES_TASKS = [TASKS[i] for i in ("rs-01", "rs-02", "rs-03")]
BROKEN = "The response should cite the rule it applies."


def reflective(stage, messages):
    """A draft that cites its rule, a revision that drops it (a regression), an audit that
    flags nothing; GEPA's reflection proposals are recorded by the test."""
    last = messages[-1]["content"]
    if stage in ("draft", "generate"):
        return "Ruling: allowed under R2."
    if stage == "audit":
        return {"confirmed_correct": [], "confirmed_data": [], "possibly_missed": [{"text": "be more complete"}],
                "possibly_wrong": []}
    if stage == "revise":
        return "Ruling: allowed, and more complete."
    if stage == "judge":
        response, requirement = last.split("[[ ## requirement ## ]]")
        if "cite the rule" in requirement:
            return {"reason": "r", "satisfaction_status": "yes" if "R2" in response else "no"}
        return {"reason": "r", "satisfaction_status": "no"}
    if stage == "propose":
        return {"new_instruction": "Try again."}
    return {}


def test_gepa_reflects_on_audit_rules_with_audit_feedback_and_on_revise_with_its_regressions():
    tasks = [t.model_copy(update={"rubrics": [BROKEN, "The response should state the penalty."]})
             for t in RULES_TASKS]
    lm, engine = scripted_lm(reflective)
    untracked_optimize(optimizer="gepa", train=tasks[:2], dev=tasks[2:], task_lm=lm, judge_lm=lm, reflection_lm=lm,
                       budget="medium", threads=1, tunable=("audit_rules", "revise"))
    reflections = [c.messages[-1]["content"].replace("\\n", "\n") for c in engine.calls if c.stage == "propose"]
    audit = [text for text in reflections if "audit_rules" in text or "rule-fidelity" in text or "rulebook" in text]
    revise = [text for text in reflections if "Regressions" in text]
    assert audit and any("did not flag these failed requirements" in text for text in audit)
    assert revise and any(f"Regressions (satisfied in the draft, broken by the revision): 1\n- {BROKEN}" in text
                          for text in revise)


def test_a_tracked_gepa_run_shows_each_candidates_dev_score_and_its_candidates(store, tmp_path):
    with ChatServer(reply=Realistic()) as server:
        task, judge = lms(server)
        result = tracked_optimize(store, optimizer="gepa", train=TRAIN, dev=DEV, budget="light", task_lm=task,
                                  judge_lm=judge, threads=2, out=tmp_path / "p.json")
    history = mlflow.MlflowClient().get_metric_history(result.run_id, "candidate.dev_rubric_pass_rate")
    assert len(history) == len(result.candidates) >= 2 and [m.step for m in history] == list(range(len(history)))
    assert [round(m.value, 6) for m in history] == [round(100 * c.score, 6) for c in result.candidates]
    artifact = mlflow.artifacts.load_dict(f"runs:/{result.run_id}/gepa/candidates.json")
    assert artifact["candidates"] and {"dev_score", "instructions", "on_pareto_front", "parents"} <= \
        set(artifact["candidates"][0])
    assert (tmp_path / "p.gepa").is_dir()  # GEPA's state beside the program: a rerun continues from it
