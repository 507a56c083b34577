"""The CL-bench family: CLBench-life rows (their own categories and sub-categories, no
context id, single-turn rows with a `<|TASK|>` delimiter) run, judge and report like
CL-bench's; `--policy` sets the specialist per category; `--reasoning-effort` reaches
the server for the task LM and the judge, and nothing is sent when it is not asked."""

import json

import mlflow
import pytest
from conftest import DATA, cli

from cg_dspy import tracking
from cg_dspy.clbench import data
from cg_dspy.clbench.store import read_rows
from cg_dspy.core.messages import LIFE_CATEGORIES, TASK_DELIMITER
from cg_dspy.method import build_program
from cg_dspy.method.program import reminder_request
from cg_dspy.method.specialists import parse_policy
from cg_dspy.saved import load_program
from cg_dspy.testing.server import ChatServer

LIFE = DATA / "life.jsonl"
SUB_CATEGORIES = {"Group Chats": LIFE_CATEGORIES[0], "Email Threads": LIFE_CATEGORIES[0],
                  "Document Revisions": LIFE_CATEGORIES[1], "Scattered Notes": LIFE_CATEGORIES[1],
                  "Fitness Logs": LIFE_CATEGORIES[2], "Purchase History": LIFE_CATEGORIES[2]}
FORMAT_CHECK = "format, structure and presentation rule"  # words of the format checker's instructions


def remote(server, *more):
    return ["--model", "openai/life-model", "--api-base", server.base_url, "--no-cache", "--quiet", *more]


def life_tasks():
    return {t.idx: t for t in data.load_tasks(LIFE, strict=True).tasks}


def reminded(body) -> str | None:
    """The request a draft call repeats (the text after its `[request]` label)."""
    last = body["messages"][-1]["content"]
    return last.rpartition("[request]\n")[2] if "[request]\n" in last and "=====" in last else None


def test_life_rows_load_with_their_own_categories_sub_categories_and_no_context_id():
    tasks = life_tasks()
    assert len(tasks) == 6
    assert {t.category for t in tasks.values()} == set(LIFE_CATEGORIES)
    assert {t.metadata.sub_category: t.category for t in tasks.values()} == SUB_CATEGORIES
    assert all(t.metadata.context_id is None for t in tasks.values())
    single = [t for t in tasks.values() if len(t.messages) == 1]
    assert len(single) == 3 and all(TASK_DELIMITER in t.request for t in single)  # both row shapes are here
    splits = data.make_splits(list(tasks.values()), seed="life")  # a task without a context id is its own
    assert sorted(i for ids in splits.values() for i in ids) == sorted(tasks)


def test_an_unknown_category_is_data_and_a_missing_one_is_an_error(tmp_path):
    row = json.loads(LIFE.read_text().splitlines()[0])
    row["metadata"]["context_category"] = "Household Logistics"
    missing = json.loads(LIFE.read_text().splitlines()[1])
    del missing["metadata"]["context_category"]
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps(missing) + "\n")
    loaded = data.load_tasks(path)
    assert [t.category for t in loaded.tasks] == ["Household Logistics"]
    (error,) = loaded.errors
    assert (error.line, error.task_id) == (2, "life-comm-2") and "metadata.context_category" in error.message


def test_clbench_life_loads_through_datasets_by_its_hub_name(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "tencent" / "CLBench-life"
    folder.mkdir(parents=True)
    (folder / "test.jsonl").write_bytes(LIFE.read_bytes())
    monkeypatch.chdir(tmp_path)
    loaded = data.load_tasks("tencent/CLBench-life:test")
    assert loaded.errors == [] and [t.idx for t in loaded.tasks] == list(life_tasks())
    assert loaded.tasks[0].metadata.sub_category == "Group Chats"


def test_the_reminder_of_a_single_turn_row_is_exactly_the_text_after_the_delimiter():
    long_context = "Notes. " * 1000
    assert reminder_request(f"{long_context}{TASK_DELIMITER}\nList my appointments.\n") == "List my appointments."
    assert reminder_request(f"a{TASK_DELIMITER}b{TASK_DELIMITER} the real task") == "the real task"
    assert reminder_request(long_context).startswith("(end of the final user message)")  # CL-bench rows: the tail


def test_life_rows_run_judge_and_report_by_their_own_categories(tmp_path):
    tasks = life_tasks()
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        r = cli("run", LIFE, "--out", out, *remote(server), "--no-track")
        assert r.returncode == 0, r.stderr
        drafts = [reminded(b) for b in server.requests if reminded(b) is not None]
        r = cli("eval", out, "--out", graded, "--judge-model", "openai/judge", "--judge-api-base", server.base_url,
                "--no-cache", "--quiet", "--no-track")
        assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tasks"] == 6
    expected = {t.request.rpartition(TASK_DELIMITER)[2].strip() if TASK_DELIMITER in t.request else t.request
                for t in tasks.values()}
    assert sorted(drafts) == sorted(expected)  # one draft per task, each repeating just its task
    for context in ("Email thread", "Notes found on my desk", "My grocery orders"):  # the single-turn contexts
        assert not any(context in d for d in drafts)
    assert {row["idx"] for row in read_rows(out)} == set(tasks)
    rep = json.loads(cli("report", graded, "--format", "json").stdout)
    run = next(iter(rep["runs"].values()))
    assert set(run["by_category"]) == set(LIFE_CATEGORIES)
    assert {k: v["tasks"] for k, v in run["by_category"].items()} == dict.fromkeys(LIFE_CATEGORIES, 2)
    assert {k: v["category"] for k, v in run["by_sub_category"].items()} == SUB_CATEGORIES
    md = cli("report", graded).stdout
    assert "| Fragmented Information & Revisions | 100.00 [34.24, 100.00] (2/2) |" in md
    assert "| Purchase History | 100.00 [20.65, 100.00] (1/1) |" in md


def checks(server) -> int:
    """How many format-checker calls the server received."""
    return sum(FORMAT_CHECK in b["messages"][-1]["content"] for b in server.requests)


def test_policy_chooses_the_specialist_per_category_and_an_unknown_category_runs_the_default(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({LIFE_CATEGORIES[0]: ["format", "separate"],
                                  LIFE_CATEGORIES[1]: {"kind": "rules", "mode": "integrated"},
                                  "Domain Knowledge Reasoning": None}))
    rules = "faithfully applying the provided rulebook"
    with ChatServer() as server:  # default: the generic audit alone for every Life category
        assert cli("run", LIFE, "--out", tmp_path / "a.jsonl", *remote(server), "--no-track").returncode == 0
        assert checks(server) == 0 and not any(rules in b["messages"][-1]["content"] for b in server.requests)
    with ChatServer() as server:
        r = cli("run", LIFE, "--out", tmp_path / "b.jsonl", "--policy", policy, *remote(server), "--no-track")
        assert r.returncode == 0, r.stderr
        assert checks(server) == 2  # the two Communication tasks, one format check each
        assert sum(rules in b["messages"][-1]["content"] for b in server.requests) == 2  # Fragmented: in the audit
    with ChatServer() as server:  # null: the paper's format checker is off for Domain Knowledge Reasoning
        assert cli("run", DATA / "demo.jsonl", "--out", tmp_path / "c.jsonl", *remote(server), "--policy", policy,
                   "--no-track").returncode == 0
        assert checks(server) == 0
        assert sum("procedure compliance checker" in b["messages"][-1]["content"] for b in server.requests) == 1
    config = read_rows(tmp_path / "b.jsonl")[0]["cg_dspy"]["run"]["config"]
    assert config["policy"][LIFE_CATEGORIES[0]] == ["format", "separate"]  # the results file says which policy
    assert config["policy"]["Domain Knowledge Reasoning"] is None
    assert config["policy"]["Procedural Task Execution"] == ["procedure", "separate"]  # the paper's, kept
    saved = tmp_path / "program.json"
    program = build_program("contextguard", policy=parse_policy(config["policy"], "policy"))
    saved.write_text(json.dumps(program.dump_state()))
    assert load_program(saved).policy == program.policy  # a saved program keeps it
    with ChatServer() as server:  # and runs by it
        assert cli("run", LIFE, "--out", tmp_path / "d.jsonl", "--program", saved, *remote(server),
                   "--no-track").returncode == 0
        assert checks(server) == 2


@pytest.mark.parametrize("body, message", [
    ("{not json", "not JSON"),
    ('{"Communication & Social Interactions": ["format", "sideways"]}', "[kind, mode]"),
    ('["format", "separate"]', "an object of category"),
])
def test_a_bad_policy_file_is_exit_2_naming_the_file_and_entry(tmp_path, body, message):
    policy = tmp_path / "policy.json"
    policy.write_text(body)
    with ChatServer() as server:
        r = cli("run", LIFE, "--out", tmp_path / "o.jsonl", "--policy", policy, *remote(server), "--no-track")
        assert server.requests == []
    assert r.returncode == 2 and str(policy) in r.stderr and message in r.stderr


def test_a_policy_naming_an_unknown_category_is_warned_and_the_papers_own_is_no_policy(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"Domain Knowledge Reasonin": None}))  # a typo
    with ChatServer() as server:
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "a.jsonl", "--policy", policy, *remote(server),
                "--no-track")
    assert r.returncode == 0 and "'Domain Knowledge Reasonin' is no category of CL-bench or CLBench-life" in r.stderr
    policy.write_text("{}")
    with ChatServer() as server:
        assert cli("run", DATA / "demo.jsonl", "--out", tmp_path / "b.jsonl", "--policy", policy, *remote(server),
                   "--no-track").returncode == 0
    assert read_rows(tmp_path / "b.jsonl")[0]["cg_dspy"]["run"]["config"]["policy"] is None  # resumes a plain run


def test_reasoning_effort_reaches_the_task_lm_and_the_judge_only_when_asked(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    with ChatServer() as task, ChatServer() as judge:
        judging = ["--judge-model", "openai/judge", "--judge-api-base", judge.base_url, "--no-cache", "--quiet"]
        assert cli("run", DATA / "demo.jsonl", "--out", tmp_path / "plain.jsonl", *remote(task),
                   "--no-track").returncode == 0
        assert cli("eval", tmp_path / "plain.jsonl", "--out", tmp_path / "plain.g.jsonl", *judging,
                   "--no-track").returncode == 0
        assert task.requests and judge.requests
        assert not any("reasoning_effort" in b for b in [*task.requests, *judge.requests])
        n_task, n_judge = len(task.requests), len(judge.requests)
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", *remote(task), "--reasoning-effort",
                "low", "--tracking-uri", uri, "--no-trace")
        assert r.returncode == 0, r.stderr
        r = cli("eval", tmp_path / "o.jsonl", "--out", tmp_path / "g.jsonl", *judging, "--judge-reasoning-effort",
                "high", "--tracking-uri", uri, "--no-trace")
        assert r.returncode == 0, r.stderr
        sent_task, sent_judge = task.requests[n_task:], judge.requests[n_judge:]
    assert sent_task and {b.get("reasoning_effort") for b in sent_task} == {"low"}
    assert sent_judge and {b.get("reasoning_effort") for b in sent_judge} == {"high"}
    assert read_rows(tmp_path / "o.jsonl")[0]["cg_dspy"]["run"]["task_lm"]["reasoning_effort"] == "low"
    assert read_rows(tmp_path / "g.jsonl")[0]["cg_dspy"]["run"]["judge_lm"]["reasoning_effort"] == "high"
    tracking.setup(uri, create=False)
    params = {r.data.tags["cg_dspy.kind"]: r.data.params for r in mlflow.search_runs(
        experiment_names=["contextguard"], output_format="list")}
    assert any(k.endswith("reasoning_effort") and v == "low" for k, v in params["run"].items()), params["run"]
    assert any(k.endswith("reasoning_effort") and v == "high" for k, v in params["eval"].items()), params["eval"]


def test_the_embedded_model_refuses_a_reasoning_effort(tmp_path):
    r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", "--reasoning-effort", "low", "--no-track")
    assert r.returncode == 2 and "does not reason" in r.stderr and not (tmp_path / "o.jsonl").exists()
