"""MLflow's evaluation tools read our results: the rubric judge as a scorer that
`mlflow.genai.evaluate` runs, on splits registered as MLflow evaluation datasets."""

import json

import mlflow
import pytest
from conftest import DATA, cli
from mlflow.genai.datasets import search_datasets

from cg_dspy import Baseline, rubric_scorer
from cg_dspy.clbench.data import load_tasks
from cg_dspy.judge.voting import judge_lm
from cg_dspy.lms import LMSettings, build_lm, using
from cg_dspy.testing.server import ChatServer
from cg_dspy.tracking import register_split, setup

TASKS = load_tasks(DATA / "demo.jsonl").tasks
FAILS = {"Brightwater": "demo-dk-1", "6 life": "demo-rs-1"}  # the judge says no to the rubric naming these


def failing_judge(server) -> None:
    for text in FAILS:
        server.inject("text", text=json.dumps({"reason": "not there", "satisfaction_status": "no"}), match=text,
                      times=1000)


def known_rates() -> tuple[float, float]:
    """The task-solving rate and the mean rubric pass rate the judge above must give,
    counted from the task files."""
    fractions = [sum(not any(t in r for t in FAILS) for r in task.rubrics) / len(task.rubrics) for task in TASKS]
    return sum(f == 1 for f in fractions) / len(TASKS), sum(fractions) / len(TASKS)


def test_genai_evaluate_with_the_rubric_scorer_on_a_registered_split_gives_the_known_rates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    setup(f"sqlite:///{tmp_path}/m.db", "cg-eval")
    dataset = register_split("dev", TASKS, source="demo.jsonl#dev")
    assert register_split("dev", TASKS, source="again").dataset_id == dataset.dataset_id  # found, not made twice
    program = Baseline()
    with ChatServer() as server:
        failing_judge(server)
        settings = LMSettings(model="openai/test-model", api_base=server.base_url, cache=False)
        lm = build_lm(settings)

        def answer(conversation, category):
            with using(lm):
                return program(conversation=conversation, category=category).answer

        result = mlflow.genai.evaluate(data=dataset, predict_fn=answer,
                                       scorers=[rubric_scorer(judge_lm=judge_lm(settings), votes=3)])
    solved, passed = known_rates()
    assert (solved, passed) == (0.5, 0.875)
    assert result.metrics["task_solved/mean"] == pytest.approx(solved)
    assert result.metrics["rubric_pass_rate/mean"] == pytest.approx(passed)
    traces = mlflow.search_traces(run_id=result.run_id, return_type="list")
    assert len(traces) == len(TASKS)  # one per task: the judge's own calls are not traces
    by_question = {t.info.request_preview: t for t in traces}
    dk = next(t for q, t in by_question.items() if "Zorvan" in q)  # the question, as the trace table shows it
    feedback = {a.name: a for a in dk.info.assessments}
    assert feedback["task_solved"].value is False and feedback["rubric_pass_rate"].value == 0.75
    assert "Requirement 4: no (not there)" in feedback["task_solved"].rationale  # the verdicts, in the rationale


def test_the_scorer_names_a_row_without_rubrics_and_reads_every_answer_shape():
    with ChatServer() as server:
        scorer = rubric_scorer(judge_lm=build_lm(LMSettings(model="openai/test-model", api_base=server.base_url)),
                               votes=1)
        with pytest.raises(ValueError, match=r"task t-7: expectations\['rubrics'\] must be a non-empty list"):
            scorer(inputs={"task_id": "t-7"}, outputs="an answer", expectations={"rubric": ["typo"]})
        with pytest.raises(ValueError, match="the row whose last message starts 'Say hi'"):
            scorer(inputs={"conversation": [{"role": "user", "content": "Say hi"}]}, outputs="hi", expectations={})
        shapes = ["an answer", {"answer": "an answer"}, type("Prediction", (), {"answer": "an answer"})()]
        for outputs in shapes:
            found = {f.name: f.value for f in scorer(inputs={}, outputs=outputs,
                                                       expectations={"rubrics": ["The response should exist."]})}
            assert found == {"task_solved": True, "rubric_pass_rate": 1.0}
        with pytest.raises(ValueError, match="outputs hold no answer"):
            scorer(inputs={}, outputs={"text": 1}, expectations={"rubrics": ["r"]})
    with pytest.raises(ValueError, match="an odd K"):
        rubric_scorer(judge_lm=None, votes=2)


def test_split_register_makes_each_split_an_evaluation_dataset_with_its_size(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    r = cli("split", str(DATA / "tasks.jsonl"), "--out", str(tmp_path / "s.json"), "--fractions", "0.34,0.33,0.33",
            "--register", "--tracking-uri", uri, "--experiment", "cg-split")
    assert r.returncode == 0, r.stderr
    printed = json.loads(r.stdout)
    setup(uri, "cg-split")
    found = {d.tags["split"]: d for d in search_datasets(filter_string="name LIKE 'contextguard.%'")}
    assert set(found) == {"train", "dev", "test"} and printed["datasets"] == {k: d.name for k, d in found.items()}
    assert {k: len(d.to_df()) for k, d in found.items()} == {k: printed[k] for k in found}
    record = found["dev"].to_df().iloc[0]
    assert set(record["inputs"]) == {"conversation", "category"} and record["expectations"]["rubrics"]


def test_rubrics_and_reasons_of_any_size_and_script_arrive_whole_or_clipped_with_a_mark(tmp_path):
    from conftest import assessment, verdicts_on

    from cg_dspy.clbench.store import read_rows
    from cg_dspy.tracking import find_traces
    from cg_dspy.tracking.assessments import CLIPPED, MAX_TEXT

    out, edited, graded = tmp_path / "o.jsonl", tmp_path / "e.jsonl", tmp_path / "g.jsonl"
    long_rubric = "The response should **quote** the table:\n| 列 | колонка |\n" + "данные 数据 " * 1000
    reason = "第一行\nвторая строка\n- a Markdown item"
    with ChatServer() as server:
        lm = ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet"]
        assert cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--method", "baseline", "--no-track",
                   *lm).returncode == 0
        rows = read_rows(out)
        dk = next(r for r in rows if r["idx"] == "demo-dk-1")
        dk["rubrics"] = [long_rubric, dk["rubrics"][1]]
        edited.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        server.inject("text", text=json.dumps({"reason": reason, "satisfaction_status": "no"}, ensure_ascii=False),
                      match="колонка", times=100)
        r = cli("eval", str(edited), "--out", str(graded), "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--no-cache", "--quiet", "--tracking-uri", f"sqlite:///{tmp_path}/m.db")
        assert r.returncode == 0, r.stderr
    setup(f"sqlite:///{tmp_path}/m.db", create=False)
    run = mlflow.search_runs(experiment_names=["contextguard"], output_format="list")[0]
    trace = next(t for t in find_traces(run.info.run_id) if t.info.tags["cg_dspy.task_id"] == "demo-dk-1")
    clipped = long_rubric[: MAX_TEXT - len(CLIPPED)] + CLIPPED
    assert len(long_rubric) > MAX_TEXT and assessment(trace, "rubrics").value == [clipped, dk["rubrics"][1]]
    first = verdicts_on(trace)[0]
    assert first.metadata["rubric"] == clipped and first.value is False
    assert first.rationale.startswith(reason + "\n\nRequirement 1: The response should **quote** the table:\n| 列 |")


def test_verdicts_for_traces_in_another_store_are_skipped_in_one_line_and_the_grading_stands(tmp_path):
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        lm = ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet"]
        assert cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--method", "baseline", "--tracking-uri",
                   f"sqlite:///{tmp_path}/a.db", *lm).returncode == 0
        r = cli("eval", str(out), "--out", str(graded), "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--no-cache", "--quiet", "--tracking-uri", f"sqlite:///{tmp_path}/b.db")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "verdicts" in line]
    assert said == ["contextguard: the verdicts of 4 of 4 graded tasks were not stored in MLflow (the graded "
                    "task's trace is not in this store)"]
    from cg_dspy.clbench.store import read_rows

    assert sorted(r["idx"] for r in read_rows(graded)) == sorted(t.idx for t in TASKS)


def test_a_task_whose_generation_failed_is_unsolved_on_its_trace_too(tmp_path):
    """MLflow's mean of task_solved over traces is the task-solving rate only if failed
    tasks are on it as unsolved."""
    from conftest import assessment, verdicts_on

    from cg_dspy.clbench.store import read_rows
    from cg_dspy.tracking import find_traces

    out, edited, graded = tmp_path / "o.jsonl", tmp_path / "e.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        lm = ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet"]
        assert cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--method", "baseline", "--no-track",
                   *lm).returncode == 0
        rows = read_rows(out)
        failed = next(r for r in rows if r["idx"] == "demo-pt-1")
        failed.update(model_output="", error="ReadTimeout: no reply")
        edited.write_text("".join(json.dumps(r) + "\n" for r in rows))
        r = cli("eval", str(edited), "--out", str(graded), "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--no-cache", "--quiet", "--tracking-uri", f"sqlite:///{tmp_path}/m.db")
        assert r.returncode == 0, r.stderr
        judged = [b for b in server.requests
                  if "satisfaction_status" in json.dumps(b) and failed["rubrics"][0] in b["messages"][-1]["content"]]
        assert len([b for b in server.requests if "satisfaction_status" in json.dumps(b)]) > 0  # others were judged
    setup(f"sqlite:///{tmp_path}/m.db", create=False)
    run = mlflow.search_runs(experiment_names=["contextguard"], output_format="list")[0]
    traces = {t.info.tags["cg_dspy.task_id"]: t for t in find_traces(run.info.run_id)}
    assert set(traces) == {t.idx for t in TASKS}
    pt = traces["demo-pt-1"]
    assert assessment(pt, "task_solved").value is False and assessment(pt, "rubric_pass_rate").value == 0.0
    assert [(a.value, a.rationale.split("\n")[0]) for a in verdicts_on(pt)] == \
        [(False, "No usable model output (ReadTimeout: no reply)")] * len(failed["rubrics"])
    assert judged == []  # graded without asking the judge
