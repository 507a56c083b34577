"""Several replicas of one LM: every task's calls on one replica, load spread, a replica
that dies mid-run loses no task, replicas of different models refused, per-endpoint
counts in the summary and the MLflow run; the assignment policy itself with plain values."""

import json

import mlflow
import pytest
from conftest import DATA, cli

from cg_dspy import tracking
from cg_dspy.clbench.store import read_rows
from cg_dspy.lms.replicas import Pinning, endpoints
from cg_dspy.testing.server import ChatServer


def test_pinning_is_least_busy_sticky_and_moves_off_a_failed_replica_until_its_cooldown_ends():
    p = Pinning(3, cooldown=30.0)
    assert [p.pin(k, 0.0) for k in "abc"] == [0, 1, 2]  # spread, not hashed
    assert p.pin("a", 1.0) == 0 and p.in_flight == [1, 1, 1]  # sticky
    p.release("b")
    assert p.pin("d", 1.0) == 1  # the least busy
    p.fail(0, 2.0)
    assert p.pin("a", 3.0) in (1, 2) and p.in_flight[0] == 0  # moved off the failed replica
    p.fail(1, 3.0)
    p.fail(2, 3.0)
    assert p.pin("e", 4.0) is None  # every replica cooling down
    assert p.pin("e", 32.1) == 0  # replica 0 back after its cool-down


def test_endpoints_are_urls_listed_once():
    assert endpoints("http://a:1/v1, http://b:2/v1/,http://a:1/v1") == (["http://a:1/v1", "http://b:2/v1"],
                                                                        ["http://a:1/v1"])
    with pytest.raises(ValueError, match="endpoint 'localhost:8000': not an http"):
        endpoints("http://a:1/v1,localhost:8000")


def task_of(body) -> str:
    """Which demo task a request belongs to: its conversation's first user message."""
    return next(m["content"] for m in body["messages"] if m["role"] == "user")[:60]


def by_task(*servers) -> dict[str, set[int]]:
    seen: dict[str, set[int]] = {}
    for i, server in enumerate(servers):
        for body in server.requests:
            seen.setdefault(task_of(body), set()).add(i)
    return seen


def flags(*servers, judge=False):
    prefix = "--judge-" if judge else "--"
    out = [f"{prefix}model", "openai/replicated"]
    for server in servers:
        out += [f"{prefix}api-base", server.base_url]
    return out


def test_each_task_stays_on_one_replica_and_the_run_counts_each_endpoint(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    with ChatServer(latency=0.02) as a, ChatServer(latency=0.02) as b:
        r = cli("run", DATA / "tasks.jsonl", "--out", tmp_path / "o.jsonl", *flags(a, b), "--threads", "4",
                "--no-cache", "--quiet", "--tracking-uri", uri, "--no-trace")
        assert r.returncode == 0, r.stderr
        placed = by_task(a, b)
        summary = json.loads(r.stdout)
    assert len(placed) == summary["finished"] == 13 and all(len(s) == 1 for s in placed.values())  # pinned
    per = summary["endpoints"]
    assert list(per) == [a.base_url, b.base_url]
    assert per[a.base_url]["tasks"] >= 4 and per[b.base_url]["tasks"] >= 4  # spread
    assert [per[s.base_url]["calls"] for s in (a, b)] == [len(a.requests), len(b.requests)]
    assert sum(v["calls"] for v in per.values()) == summary["lm_calls"] and not any(v["failures"] for v in per.values())
    tracking.setup(uri, create=False)
    (run,) = mlflow.search_runs(experiment_names=["contextguard"], output_format="list")
    assert run.data.tags["endpoint.1"] == b.base_url and run.data.metrics["endpoint.1.calls"] == len(b.requests)
    settings = read_rows(tmp_path / "o.jsonl")[0]["cg_dspy"]["run"]["task_lm"]
    assert settings["api_base"] == sorted([a.base_url, b.base_url])  # the set, whatever order it was given in


def test_a_replica_killed_mid_run_loses_no_task(tmp_path):
    with ChatServer(latency=0.05, die_after=6) as a, ChatServer(latency=0.05) as b:  # a dies on its 6th request
        r = cli("run", DATA / "tasks.jsonl", "--out", tmp_path / "o.jsonl", *flags(a, b), "--threads", "4",
                "--no-cache", "--quiet", "--no-track")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["finished"] == 13 and summary["failed"] == 0
    per = summary["endpoints"]
    assert per[a.base_url]["failures"] >= 1 and per[b.base_url]["failures"] == 0
    assert per[b.base_url]["calls"] == len(b.requests)
    assert per[a.base_url]["tasks"] + per[b.base_url]["tasks"] > 13  # the dead replica's tasks moved (counted twice)
    assert len(read_rows(tmp_path / "o.jsonl")) == 13  # each task once


def test_replicas_of_different_models_stop_with_a_clear_reason(tmp_path):
    with ChatServer(served_model="qwen-4b") as a, ChatServer(served_model="llama-8b") as b:
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", *flags(a, b), "--threads", "2",
                "--no-cache", "--quiet", "--no-track")
    assert r.returncode != 0
    assert "the replicas serve different models" in r.stderr and "qwen-4b" in r.stderr and "llama-8b" in r.stderr
    failures = [line for line in r.stderr.splitlines() if line.startswith("failed task")]
    assert failures and all("different models" in line for line in failures)  # no task fails for another reason
    assert json.loads(r.stdout)["failed"] == len(failures)


def test_an_endpoint_listed_twice_is_one_replica_and_one_that_is_not_a_url_is_exit_2(tmp_path):
    with ChatServer() as a:
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", *flags(a, a), "--no-cache", "--quiet",
                "--no-track")
        assert r.returncode == 0 and f"--api-base {a.base_url} is listed twice" in r.stderr
        assert "endpoints" not in json.loads(r.stdout)  # one replica: a plain endpoint
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "p.jsonl", "--model", "openai/m", "--api-base",
                f"{a.base_url},localhost:9", "--no-track")
    assert r.returncode == 2 and "endpoint 'localhost:9': not an http(s) URL" in r.stderr
    assert not (tmp_path / "p.jsonl").exists()


def test_each_graded_tasks_votes_go_to_one_judge_replica(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer() as task:
        assert cli("run", DATA / "demo.jsonl", "--out", out, "--model", "openai/t", "--api-base", task.base_url,
                   "--no-cache", "--quiet", "--no-track").returncode == 0
    with ChatServer() as a, ChatServer() as b:
        r = cli("eval", out, "--out", tmp_path / "g.jsonl", "--judge-model", "openai/judge", "--judge-api-base",
                f"{a.base_url},{b.base_url}", "--votes", "3", "--no-early-stop", "--no-cache", "--quiet",
                "--no-track")
        assert r.returncode == 0, r.stderr
        answers = {row["model_output"] for row in read_rows(out)}
        where: dict[str, set[int]] = {}
        for i, server in enumerate((a, b)):
            for body in server.requests:
                text = body["messages"][-1]["content"]
                answer = next(x for x in answers if x in text)
                where.setdefault(answer, set()).add(i)
    assert len(where) == 4 and all(len(s) == 1 for s in where.values())
    assert {i for s in where.values() for i in s} == {0, 1}
    assert set(json.loads(r.stdout)["endpoints"]) == {a.base_url, b.base_url}


def test_with_every_replica_down_the_tasks_fail_and_a_rerun_continues(tmp_path):
    with ChatServer() as a, ChatServer() as b:
        a.kill()
        b.kill()
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", *flags(a, b), "--no-cache", "--quiet",
                "--no-track")
    assert r.returncode == 1 and "every replica is down" in r.stderr
    with ChatServer() as c:  # the rerun, on a live endpoint, finishes what was left
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", "--model", "openai/replicated",
                "--api-base", c.base_url, "--no-cache", "--quiet", "--no-track", "--resume-anyway")
    assert r.returncode == 0 and json.loads(r.stdout)["finished"] == 4


def test_optimize_over_replicas_counts_every_replicas_calls(tmp_path):
    with ChatServer() as a, ChatServer() as b:
        r = cli("optimize", "--optimizer", "bootstrap", "--train", DATA / "demo.jsonl", "--dev", DATA / "life.jsonl",
                "--out", tmp_path / "p.json", *flags(a, b), "--judge-model", "openai/judge", "--judge-api-base",
                f"{a.base_url},{b.base_url}", "--dev-votes", "1", "--no-cache", "--quiet", "--no-track")
        assert r.returncode == 0, r.stderr
        served = len(a.requests) + len(b.requests)
    assert a.requests and b.requests
    assert f"called: {served} " in r.stderr  # the count and the cap see every replica


def test_a_request_every_replica_refuses_fails_its_task_alone_and_takes_no_replica_down(tmp_path):
    with ChatServer() as a, ChatServer() as b:
        for server in (a, b):  # a 500 for one task's prompts only: the request's fault, not the replicas'
            server.inject("status", status=500, match="Zorvan", times=99)
        r = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", *flags(a, b), "--threads", "2",
                "--no-cache", "--quiet", "--no-track")
    summary = json.loads(r.stdout)
    assert r.returncode == 1 and (summary["finished"], summary["failed"]) == (3, 1)
    assert "failed task demo-dk-1" in r.stderr and "every replica is down" not in r.stderr


def test_endpoint_counts_are_requests_of_this_run_not_cache_hits_or_earlier_repeats(tmp_path):
    with ChatServer() as a, ChatServer() as b:
        first = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "o.jsonl", *flags(a, b), "--quiet", "--no-track")
        again = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "p.jsonl", *flags(a, b), "--quiet", "--no-track")
        repeats = cli("run", DATA / "demo.jsonl", "--out", tmp_path / "r.jsonl", *flags(a, b), "--repeats", "2",
                      "--no-cache", "--quiet", "--no-track")
    first, again = json.loads(first.stdout), json.loads(again.stdout)
    assert sum(v["calls"] for v in first["endpoints"].values()) == first["lm_calls"] > 0
    assert again["cached_answers"] > 0 and not any(v["calls"] for v in again["endpoints"].values())  # DSPy's cache
    for summary in json.loads(repeats.stdout).values():  # each repeat counts its own calls and tasks
        assert sum(v["calls"] for v in summary["endpoints"].values()) == summary["lm_calls"]
        assert sum(v["tasks"] for v in summary["endpoints"].values()) == 4
