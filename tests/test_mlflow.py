"""MLflow as people open it: the Prompt Registry after two optimize runs, a trace per task
with spans named by stage and its verdicts as assessments, honest run pages, and one
logged model that both MLflow loaders open."""

import json
from pathlib import Path

import mlflow
import pytest
from conftest import DATA, assessment, cli, tracked_optimize, verdicts_on
from mlflow.genai.datasets import search_datasets
from scripted import scripted_lm
from test_optimize import RULE, behaviour, by_ids

from cg_dspy import ContextGuard, tracking
from cg_dspy.clbench.store import read_rows
from cg_dspy.lms import LMSettings
from cg_dspy.optimize.compile import DEFAULT_TUNABLE
from cg_dspy.testing.server import ChatServer


@pytest.fixture(scope="module")
def two_run_store(tmp_path_factory):
    """One store with two optimize runs, shared by the tests that only read it."""
    import os

    import dspy

    folder = tmp_path_factory.mktemp("two-runs")
    here = os.getcwd()
    os.chdir(folder)  # MLflow's default artifact root is relative to the working directory
    try:
        uri = f"sqlite:///{folder}/mlflow.db"
        tracking.setup(uri, "cg-test")
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
        lm, _ = scripted_lm(behaviour)
        train, dev = by_ids("dk-01", "rs-01"), by_ids("dk-03", "rs-03")
        params = {"task_lm": LMSettings(model="openai/scripted", max_tokens=256).describe(), "train": "train-split",
                  "dev": "dev-split"}
        runs = [tracked_optimize(uri, optimizer=name, train=train, dev=dev, task_lm=lm, judge_lm=lm, reflection_lm=lm,
                                 budget="light", threads=2, out=folder / f"{name}.json", params=params)
                for name in ("bootstrap", "gepa")]
    finally:
        os.chdir(here)
    return uri, runs


@pytest.fixture
def two_runs(two_run_store):
    uri, runs = two_run_store
    mlflow.set_tracking_uri(uri)
    return runs


def test_two_optimize_runs_leave_versioned_prompts_linked_runs_and_their_splits(two_runs):
    stages = [name for name, _ in ContextGuard().named_predictors()]
    registered = {p.name for p in mlflow.genai.search_prompts()}
    assert registered == {f"contextguard.{s}" for s in stages}  # a variant is complete: every stage
    client = mlflow.MlflowClient()
    for result in two_runs:
        run = mlflow.get_run(result.run_id)
        saved = tracking.load_program_state(f"runs:/{result.run_id}")
        linked = {(p["name"], str(p["version"])) for p in json.loads(run.data.tags["mlflow.linkedPrompts"])}
        assert {name for name, _ in linked} == registered  # the run page lists its prompts
        for stage in DEFAULT_TUNABLE:
            mine = [v for v in client.search_prompt_versions(f"contextguard.{stage}")
                    if (v.tags or {}).get("run_id") == result.run_id]
            assert len(mine) == 1 and mine[0].template == saved[stage]["signature"]["instructions"]
            assert (f"contextguard.{stage}", str(mine[0].version)) in linked
            assert mine[0].tags["optimizer"] == result.settings["optimizer"]
            assert mine[0].commit_message.startswith(f"{result.settings['optimizer']} (light): dev task-solving rate")
        contexts = {d.tags[0].value for d in run.inputs.dataset_inputs}
        assert contexts == {"train", "dev"}
        # each split is one MLflow evaluation dataset (the same one for both runs), linked as a run input
        names = {d.tags[0].value: d.dataset.name for d in run.inputs.dataset_inputs}
        assert names["train"].startswith("contextguard.train.") and names["dev"].startswith("contextguard.dev.")
        datasets = {d.name: d for d in search_datasets(filter_string="name LIKE 'contextguard.%'")}
        assert set(datasets) == set(names.values())
        assert {split: len(datasets[name].to_df()) for split, name in names.items()} == \
            {"train": result.settings["train_size"], "dev": result.settings["dev_size"]}
        assert datasets[names["dev"]].tags["source"] == "dev-split"
        instructions = [p.signature.instructions for _, p in ContextGuard().named_predictors()]
        assert not any(text[:60] in value for value in run.data.params.values() for text in instructions)
        assert run.data.params["task_lm.max_tokens"] == "256"  # a number, not redacted as a "token"
        assert not any(k.startswith("ContextGuard.") for k in run.data.params)  # no stale program state
    for stage in DEFAULT_TUNABLE:
        versions = list(client.search_prompt_versions(f"contextguard.{stage}"))
        assert len(versions) >= 3 and min(int(v.version) for v in versions if v.tags["variant"] == "base") == 1
    assert RULE in {v.template for v in client.search_prompt_versions("contextguard.audit")}


def test_each_optimize_run_logs_one_model_with_a_signature_that_both_loaders_open(two_runs, monkeypatch):
    import mlflow.dspy

    result = two_runs[1]
    experiment = mlflow.get_run(result.run_id).info.experiment_id
    models = mlflow.search_logged_models(experiment_ids=[experiment], output_format="list")
    assert [m.source_run_id for m in models].count(result.run_id) == 1  # one model per run, none Pending
    uri = next(m.model_uri for m in models if m.source_run_id == result.run_id)
    info = mlflow.models.get_model_info(uri)
    assert info.signature is not None and {i.name for i in info.signature.inputs} == {"conversation", "category"}
    requirements = Path(mlflow.pyfunc.get_model_dependencies(uri)).read_text().split()
    from importlib.metadata import version
    assert requirements == [f"{d}=={version(d)}" for d in ("cg-dspy", "dspy", "mlflow")]  # pinned, not inferred
    loaded = mlflow.dspy.load_model(uri)
    mlflow.clear_active_model()
    assert loaded.audit.signature.instructions == result.program.audit.signature.instructions
    with ChatServer() as server:  # the model calls the LM its loader's environment names
        monkeypatch.setenv("CG_MODEL", "openai/served-model")
        monkeypatch.setenv("CG_API_BASE", server.base_url)
        model = mlflow.pyfunc.load_model(uri)
        mlflow.clear_active_model()
        out = model.predict({"conversation": [{"role": "user", "content": "Name the closest planet."}],
                             "category": "Domain Knowledge Reasoning"})
        assert out["answer"].startswith("Answer ") and out["path"] in ("early-return", "revised", "rolled-back")
        assert server.requests and {b["model"] for b in server.requests} == {"served-model"}
    artifacts = json.dumps([a.path for a in mlflow.artifacts.list_artifacts(artifact_uri=uri)])
    assert "served-model" not in artifacts


def test_run_and_eval_trace_every_task_by_stage_with_its_question_answer_grade_and_rubrics(tmp_path):
    uri = f"sqlite:///{tmp_path}/runs.db"
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        lm = ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet"]
        r = cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--tracking-uri", uri, *lm)
        assert r.returncode == 0, r.stderr
        r = cli("eval", str(out), "--out", str(graded), "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--no-cache", "--quiet", "--tracking-uri", uri)
        assert r.returncode == 0, r.stderr
    tracking.setup(uri, create=False)
    runs = {r.data.tags["cg_dspy.kind"]: r for r in mlflow.search_runs(experiment_names=["contextguard"],
                                                                      output_format="list")}
    assert set(runs) == {"run", "eval"}
    traces = tracking.find_traces(runs["run"].info.run_id)
    rows = {x["idx"]: x for x in read_rows(out)}
    ids = tracking.trace_ids(runs["run"].info.run_id)
    assert len(traces) == len(rows) and set(ids) == set(rows)  # one trace per task, found by its task id
    assert all(x["trace"]["mlflow"] == {"run_id": runs["run"].info.run_id} for x in rows.values())
    for trace in traces:
        names = [s.name for s in trace.data.spans]
        assert names[0] == "contextguard" and "draft" in names and "audit" in names
        assert set(names) <= {"contextguard", "draft", "audit", "format_check", "procedure_check", "revise", "guard"}
        audit = next(s for s in trace.data.spans if s.name == "audit")
        assert audit.attributes["calls"] == 1 and "prompt_tokens" in audit.attributes
        # what the audit said is on its span (the UI shows a span's outputs)
        assert {"confirmed_correct", "confirmed_data", "possibly_missed", "possibly_wrong"} <= set(audit.outputs)
        draft = next(s for s in trace.data.spans if s.name == "draft")
        assert draft.outputs["answer"] == rows[trace.info.tags["cg_dspy.task_id"]]["trace"]["draft"]
        assert trace.data.spans[0].attributes["path"] == "early-return"
        row = rows[trace.info.tags["cg_dspy.task_id"]]
        # the stages' tokens add up to the trace's usage (MLflow's Tokens column)
        stages = row["trace"]["cost"].values()
        prompt, completion = sum(c["prompt_tokens"] for c in stages), sum(c["completion_tokens"] for c in stages)
        assert prompt > 0 and trace.info.token_usage == {"input_tokens": prompt, "output_tokens": completion,
                                                         "total_tokens": prompt + completion}
        # the root span holds the task and the answer: MLflow's Request and Response columns
        assert trace.data.spans[0].inputs["messages"] == row["messages"]
        assert trace.data.spans[0].outputs["choices"][0]["message"] == {"role": "assistant",
                                                                         "content": row["model_output"]}
    verdicts = {x["idx"]: x for x in read_rows(graded)}
    listed = {t.info.tags["cg_dspy.task_id"]: t.info for t in mlflow.search_traces(
        locations=[runs["run"].info.experiment_id], run_id=runs["run"].info.run_id, return_type="list")}
    for idx, row in rows.items():
        assert listed[idx].request_preview == row["messages"][-1]["content"][:1000]  # the task's last message
        assert listed[idx].response_preview == row["model_output"][:1000]  # the answer
        trace = mlflow.get_trace(ids[idx])
        statuses = verdicts[idx]["requirement_status"]
        assert assessment(trace, "task_solved").value is (verdicts[idx]["score"] == 1)
        assert assessment(trace, "rubric_pass_rate").value == round(statuses.count("yes") / len(statuses), 6)
        assert assessment(trace, "rubrics").value == row["rubrics"]  # the rubrics as the expectation
        mine = verdicts_on(trace)
        assert [a.value for a in mine] == [s == "yes" for s in statuses]
        assert [a.metadata["rubric"] for a in mine] == row["rubrics"]
    # named by requirement type, so MLflow's average of a name is one type's pass rate
    dk = verdicts_on(mlflow.get_trace(ids["demo-dk-1"]))
    assert [a.name for a in dk] == ["requirement/conditional_rules", "requirement/other", "requirement/format_lexical",
                                    "requirement/format_lexical"]
    # the eval run's page lists the traces it graded (they were written by the run)
    assert set(tracking.trace_ids(runs["eval"].info.run_id).values()) == set(ids.values())


def test_eval_of_an_untraced_results_file_traces_the_grading(tmp_path):
    uri = f"sqlite:///{tmp_path}/e.db"
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        assert cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--method", "baseline", "--no-track",
                   "--model", "openai/test-model", "--api-base", server.base_url, "--quiet").returncode == 0
        server.inject("text", text='{"reason": "no closing line", "satisfaction_status": "no"}', match="Brightwater",
                      times=100)
        r = cli("eval", str(out), "--out", str(graded), "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--no-cache", "--quiet", "--tracking-uri", uri)
        assert r.returncode == 0, r.stderr
    tracking.setup(uri, create=False)
    run = mlflow.search_runs(experiment_names=["contextguard"], output_format="list")[0]
    traces = tracking.find_traces(run.info.run_id)
    assert len(traces) == 4 and {t.data.spans[0].name for t in traces} == {"judge"}
    rows = {x["idx"]: x for x in read_rows(graded)}
    assert rows["demo-dk-1"]["cg_dspy"]["trace"] == {"run_id": run.info.run_id}
    dk = mlflow.get_trace(tracking.trace_ids(run.info.run_id)["demo-dk-1"])
    verdicts = [(a.value, a.rationale) for a in verdicts_on(dk)]
    assert verdicts[3][0] is False  # the one rubric that names Brightwater
    rubric = rows["demo-dk-1"]["rubrics"][3]
    assert verdicts[3][1].startswith("no closing line\n\nRequirement 4: " + rubric)  # what failed, in the UI
    assert [v for v, _ in verdicts[:3]] == [True, True, True]
    assert assessment(dk, "task_solved").value is False and assessment(dk, "rubric_pass_rate").value == 0.75
    assert dk.info.request_preview == rows["demo-dk-1"]["messages"][-1]["content"][:1000]
    assert dk.info.response_preview == rows["demo-dk-1"]["model_output"][:1000]  # the graded answer
    assert rows["demo-dk-1"]["requirement_status"] == ["yes", "yes", "yes", "no"]


def test_an_alias_names_one_runs_whole_program_and_untuned_stages_link_what_the_run_used(store, tmp_path):
    lm, _ = scripted_lm(behaviour)
    train, dev = by_ids("dk-01", "dk-02"), by_ids("dk-03", "dk-04")
    first = tracked_optimize(store, optimizer="gepa", train=train, dev=dev, task_lm=lm, judge_lm=lm, reflection_lm=lm,
                             budget="light", threads=2, tunable=("audit", "revise"), alias="best")
    assert first.program.audit.signature.instructions == RULE
    second = tracked_optimize(store, optimizer="bootstrap", train=train, dev=dev, task_lm=lm, judge_lm=lm,
                              budget="light", threads=2, tunable=("revise",), alias="best",
                              ablate=("protection",))
    state = tracking.load_prompt_state("prompts:/contextguard@best")
    assert state["audit"]["signature"]["instructions"] == ContextGuard().audit.signature.instructions  # not RULE
    assert state["revise"]["signature"]["instructions"] == second.program.revise.signature.instructions
    assert state["cg_dspy"]["ablate"] == ["protection"]  # the settings of the run the alias names
    linked = {p["name"]: int(p["version"])
              for p in json.loads(mlflow.get_run(second.run_id).data.tags["mlflow.linkedPrompts"])}
    assert linked["contextguard.audit"] == 1  # the base it ran with, not the first run's tuned version
