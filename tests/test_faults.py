"""LM faults, interrupts and secrets, against a real OpenAI-compatible server on 127.0.0.1.

Each test injects one fault for one task (matched by text unique to that task) and
checks the recorded reason, the scores, and that every other task finished.
"""

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import DATA, cli

from cg_dspy.clbench.store import read_rows
from cg_dspy.testing.server import ChatServer

PT = "Harbor Lane"  # text only demo-pt-1 contains
IDS = ["demo-dk-1", "demo-ed-1", "demo-pt-1", "demo-rs-1"]


def run_demo(server, out, *extra):
    return cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--model", "openai/test-model",
               "--api-base", server.base_url, "--quiet", "--no-cache", "--retries", "2", "--timeout", "2", "--no-track",
               *extra)


def by_id(path):
    return {r["idx"]: r for r in read_rows(path)}


def requests_for(server, text):
    return [r for r in server.requests if text in json.dumps(r)]


def test_429_with_retry_after_is_retried_after_waiting(tmp_path):
    with ChatServer() as server:
        server.inject("status", status=429, headers={"Retry-After": "1"}, match=PT)
        r = run_demo(server, tmp_path / "o.jsonl")
        assert r.returncode == 0, r.stderr
        hits = [t for t, b in zip(server.arrivals, server.requests) if PT in json.dumps(b)]
        assert hits[1] - hits[0] >= 0.9  # waited as Retry-After asked
    assert sorted(by_id(tmp_path / "o.jsonl")) == IDS


@pytest.mark.parametrize("kind, kwargs", [("status", {"status": 503}), ("status", {"status": 500}),
                                          ("reset", {})])
def test_transient_faults_are_retried_and_the_task_finishes(tmp_path, kind, kwargs):
    with ChatServer() as server:
        server.inject(kind, match=PT, times=2, **kwargs)
        r = run_demo(server, tmp_path / "o.jsonl")
        assert r.returncode == 0, r.stderr
        assert len(requests_for(server, PT)) == 3 + 2  # draft, audit, checker, plus two failed tries
    rows = by_id(tmp_path / "o.jsonl")
    assert sorted(rows) == IDS and not any(r.get("error") for r in rows.values())


@pytest.mark.parametrize("kind, kwargs, reason, tries", [
    ("status", {"status": 503}, "503", 3),  # one try + two retries
    ("delay", {"seconds": 4}, "no reply within 2 s", 1),  # never retried: the server may still be generating
])
def test_retry_budget_exhausted_or_timeout_fails_that_task_only(tmp_path, kind, kwargs, reason, tries):
    with ChatServer() as server:
        server.inject(kind, match=PT, times=100, **kwargs)
        r = run_demo(server, tmp_path / "o.jsonl")
        assert r.returncode == 1
        assert len(requests_for(server, PT)) == tries
    rows = by_id(tmp_path / "o.jsonl")
    assert sorted(rows) == IDS
    assert reason in rows["demo-pt-1"]["error"].lower() and rows["demo-pt-1"]["model_output"] == ""
    assert all(not rows[i].get("error") for i in IDS if i != "demo-pt-1")
    assert "failed task demo-pt-1" in r.stderr


def test_context_window_error_fails_at_once(tmp_path):
    with ChatServer() as server:
        server.inject("context_length", match=PT, times=100)
        r = run_demo(server, tmp_path / "o.jsonl")
        assert r.returncode == 1 and len(requests_for(server, PT)) == 1
    assert "context" in by_id(tmp_path / "o.jsonl")["demo-pt-1"]["error"].lower()


@pytest.mark.parametrize("kind, kwargs", [("empty", {}), ("text", {"text": "Looks fine to me!"}),
                                          ("text", {"text": '{"confirmed_correct": "all", "possibly_missed": 3}'})])
def test_unusable_audit_output_keeps_the_draft_with_its_reason(tmp_path, kind, kwargs):
    with ChatServer() as server:
        server.inject(kind, match='- "confirmed_correct"', times=100, **kwargs)
        r = run_demo(server, tmp_path / "o.jsonl")
        assert r.returncode == 0, r.stderr
    for row in by_id(tmp_path / "o.jsonl").values():
        assert row["trace"]["path"] == "stage-failed"
        assert row["model_output"] == row["trace"]["draft"]
        assert row["trace"]["failures"][0].startswith("audit: unusable output")


def test_empty_draft_fails_the_task_and_it_is_unsolved_when_graded(tmp_path):
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        server.inject("empty", match=PT, times=100)
        assert run_demo(server, out).returncode == 1
        r = cli("eval", str(out), "--out", str(graded), "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--quiet", "--no-track")
        assert r.returncode == 0, r.stderr
    g = by_id(graded)
    assert g["demo-pt-1"]["score"] == 0 and set(g["demo-pt-1"]["requirement_status"]) == {"no"}
    assert len(g["demo-pt-1"]["requirement_status"]) == 5
    assert all(g[i]["score"] == 1 for i in IDS if i != "demo-pt-1")


def test_failed_judge_votes_fail_that_task_with_reason_and_rerun_grades_it(tmp_path):
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        assert run_demo(server, out).returncode == 0
        server.inject("status", status=500, match="Step N", times=100)  # a rubric of demo-pt-1 only
        args = ["eval", str(out), "--out", str(graded), "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--quiet", "--no-track", "--retries", "1", "--no-cache"]
        r = cli(*args)
        assert r.returncode == 1 and "failed to grade demo-pt-1" in r.stderr
        rows = by_id(graded)
        assert "500" in rows["demo-pt-1"]["error"] and rows["demo-pt-1"]["score"] == 0
        assert all(rows[i]["score"] == 1 for i in IDS if i != "demo-pt-1")
        server.faults.clear()
        assert cli(*args).returncode == 0
    rows = read_rows(graded)
    assert len(rows) == 4 and all(r["score"] == 1 for r in rows)


def test_sigint_finishes_tasks_in_flight_and_says_how_to_resume(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer(latency=0.3) as server:
        args = [sys.executable, "-m", "cg_dspy.cli", "run", str(DATA / "tasks.jsonl"), "--out", str(out),
                "--model", "openai/test-model", "--api-base", server.base_url, "--threads", "2", "--quiet"]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60  # never hang CI if the child dies early
        while len(read_rows(out)) < 2 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130
        assert "Rerun the same command to resume" in stderr
        done = read_rows(out)
        assert 2 <= len(done) < 13 and json.loads(stdout)["interrupted"] is True
        server.latency = 0  # slow replies only kept tasks in flight for the signal
        r = cli(*args[3:])
        assert r.returncode == 0, r.stderr
    rows = read_rows(out)
    assert len(rows) == 13 and len({r["idx"] for r in rows}) == 13


def test_rerunning_a_finished_command_makes_no_call_and_changes_nothing(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer() as server:
        args = ["run", str(DATA / "demo.jsonl"), "--out", str(out), "--model", "openai/test-model",
                "--api-base", server.base_url, "--quiet", "--temperature", "0"]
        assert cli(*args).returncode == 0
        first, n = out.read_bytes(), len(server.requests)
        assert cli(*args).returncode == 0
        assert len(server.requests) == n and out.read_bytes() == first


def test_api_key_appears_in_no_file_the_run_writes(tmp_path, monkeypatch):
    secret = "sk-live-0123456789abcdefSECRET"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.chdir(tmp_path)
    with ChatServer() as server:
        base = ["--model", "openai/test-model", "--api-base", server.base_url, "--quiet"]
        assert cli("run", str(DATA / "demo.jsonl"), "--out", "o.jsonl", *base).returncode == 0
        r = cli("eval", "o.jsonl", "--out", "g.jsonl", "--judge-model", "openai/test-model", "--judge-api-base",
                server.base_url, "--quiet", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db")
        assert r.returncode == 0, r.stderr
        sent = [r for r in server.requests]
    assert sent  # the key did go to the server, as it should
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "mlflow.db" for p in written) and any(p.name == "g.jsonl" for p in written)
    assert [p for p in written if secret.encode() in p.read_bytes()] == []


def test_task_text_cannot_choose_where_output_goes(tmp_path):
    row = json.loads((DATA / "demo.jsonl").read_text().splitlines()[0])
    row["metadata"]["task_id"] = "../../escaped"
    tasks = tmp_path / "t.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    before = set(tmp_path.parent.iterdir())
    with ChatServer() as server:
        r = cli("run", str(tasks), "--out", str(tmp_path / "o.jsonl"), "--model", "openai/test-model",
                "--api-base", server.base_url, "--quiet")
    assert r.returncode == 0 and set(tmp_path.parent.iterdir()) == before
    assert [x["idx"] for x in read_rows(tmp_path / "o.jsonl")] == ["../../escaped"]


def test_eval_regrades_a_task_whose_generation_was_rerun(tmp_path):
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    judge = ["--judge-model", "openai/test-model", "--quiet", "--no-track"]
    with ChatServer() as server:
        server.inject("empty", match=PT, times=100)
        assert run_demo(server, out).returncode == 1
        assert cli("eval", str(out), "--out", str(graded), "--judge-api-base", server.base_url, *judge).returncode == 0
        assert by_id(graded)["demo-pt-1"]["score"] == 0
        server.faults.clear()
        assert run_demo(server, out).returncode == 0
        n = len(server.requests)
        assert cli("eval", str(out), "--out", str(graded), "--judge-api-base", server.base_url, *judge).returncode == 0
        assert len(server.requests) - n == 5 * 2  # only demo-pt-1's five rubrics, two agreeing votes each
    rows = read_rows(graded)
    assert len(rows) == 4 and all(r["score"] == 1 for r in rows)
