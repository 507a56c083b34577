"""The `contextguard` command end to end, against a real HTTP server on 127.0.0.1."""

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import DATA, cli

from cg_dspy.clbench.store import read_rows
from cg_dspy.testing.server import ChatServer


def remote(server, track=False):
    return ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet",
            *([] if track else ["--no-track"])]


def judge_remote(server):
    return ["--judge-model", "openai/test-model", "--judge-api-base", server.base_url]


def test_run_eval_report_against_an_openai_compatible_server(tmp_path):
    out, graded = tmp_path / "out.jsonl", tmp_path / "graded.jsonl"
    with ChatServer() as server:
        r = cli("run", str(DATA / "demo.jsonl"), "--method", "contextguard", "--out", str(out), *remote(server))
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert summary["finished"] == 4 and summary["failed"] == 0
        assert summary["lm_calls"] == len(server.requests) == 10  # draft+audit(+format/procedure checker) each
        rows = read_rows(out)
        assert sorted(r["idx"] for r in rows) == ["demo-dk-1", "demo-ed-1", "demo-pt-1", "demo-rs-1"]
        for row in rows:
            assert set(row) >= {"idx", "messages", "model_output", "rubrics", "metadata", "trace"}
            assert row["trace"]["path"] == "early-return" and row["model_output"] == row["trace"]["draft"]
            assert "audit" in row["trace"] and "cost" in row["trace"]
        r = cli("eval", str(out), "--out", str(graded), "--votes", "3", *judge_remote(server), "--no-cache",
                "--quiet")
        assert r.returncode == 0, r.stderr
        said = json.loads(r.stdout)  # the rate with its Wilson interval (4 of 4)
        assert (said["solved"], said["task_solving_rate"], said["task_solving_rate_ci95"]) == (4, 100.0, [51.01, 100.0])
        g = read_rows(graded)
        assert len(g) == 4 and all(x["score"] == 1 and set(x["requirement_status"]) == {"yes"} for x in g)
        assert all(len(v) == 2 for x in g for v in x["votes"])  # 2 agreeing votes decide K=3
    r = cli("report", str(graded), "--format", "json", "--plots", str(tmp_path / "plots"))
    rep = json.loads(r.stdout)
    assert rep["runs"]["contextguard"]["task_solving_rate"] == 100.0  # runs are named by their method
    assert rep["judge_stability"] is None and "eval --no-early-stop" in rep["judge_stability_reason"]
    assert (tmp_path / "plots" / "tsr_by_length.png").exists()


def test_calls_count_without_server_usage_and_cache_hits_count_apart(tmp_path):
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    with ChatServer(report_usage=False) as server:
        args = ["--method", "contextguard", "--model", "openai/test-model", "--api-base", server.base_url, "--quiet"]
        r = cli("run", str(DATA / "demo.jsonl"), "--out", str(first), *args)
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert summary["lm_calls"] == len(server.requests) == 10 and summary["cached_answers"] == 0
        assert summary["prompt_tokens"] == 0  # the server reported none
        r = cli("run", str(DATA / "demo.jsonl"), "--out", str(second), *args)  # same prompts: DSPy's cache
        assert r.returncode == 0, r.stderr
        summary = json.loads(r.stdout)
        assert len(server.requests) == 10 and summary["lm_calls"] == 0 and summary["cached_answers"] == 10
    before = {row["idx"]: row["trace"]["cost"] for row in read_rows(first)}
    for row in read_rows(second):
        for stage, cost in row["trace"]["cost"].items():
            assert (cost["calls"], cost["cached"]) == (0, before[row["idx"]][stage]["calls"]) == (0, 1)


def test_failed_task_is_recorded_others_finish_and_rerun_retries_it(tmp_path):
    out = tmp_path / "out.jsonl"
    with ChatServer() as server:
        server.inject("context_length", match="Quillstone", times=100)
        r = cli("run", str(DATA / "demo.jsonl"), "--out", str(out), *remote(server))
        assert r.returncode == 1
        assert "failed task demo-rs-1" in r.stderr and "context" in r.stderr.lower()
        rows = read_rows(out)
        assert sorted((x["idx"], bool(x.get("error"))) for x in rows) == [
            ("demo-dk-1", False), ("demo-ed-1", False), ("demo-pt-1", False), ("demo-rs-1", True)]
        server.faults.clear()
        before = len(server.requests)
        r = cli("run", str(DATA / "demo.jsonl"), "--out", str(out), *remote(server))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["resumed"] == 3
        assert len(server.requests) - before == 2  # only the failed task ran again
    rows = read_rows(out)
    assert len(rows) == 4 and len({x["idx"] for x in rows}) == 4 and not any(x.get("error") for x in rows)


def test_bad_rows_are_skipped_and_reported_and_strict_stops_before_any_call(tmp_path):
    good = (DATA / "demo.jsonl").read_text().splitlines()
    bad = tmp_path / "mixed.jsonl"
    bad.write_text("\n".join([good[0], "{broken", good[1]]) + "\n")
    with ChatServer() as server:
        r = cli("run", str(bad), "--out", str(tmp_path / "o.jsonl"), *remote(server))
        assert r.returncode == 1
        assert f"{bad}:2:" in r.stderr and "invalid JSON" in r.stderr
        assert len(read_rows(tmp_path / "o.jsonl")) == 2
        n = len(server.requests)
        r = cli("run", str(bad), "--strict", "--out", str(tmp_path / "s.jsonl"), *remote(server))
        assert r.returncode == 2 and "invalid input" in r.stderr
        assert len(server.requests) == n and not (tmp_path / "s.jsonl").exists()


def test_sigkill_mid_run_then_rerun_leaves_every_task_exactly_once(tmp_path):
    out = tmp_path / "out.jsonl"
    with ChatServer(latency=0.15) as server:
        args = ["run", str(DATA / "tasks.jsonl"), "--out", str(out), "--threads", "2", *remote(server)]
        proc = subprocess.Popen([sys.executable, "-m", "cg_dspy.cli", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline and len(read_rows(out)) < 4 and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        server.latency = 0  # slow replies only kept tasks in flight for the kill
        partial = read_rows(out)
        assert 4 <= len(partial) < 13
        r = cli("run", *args[1:])
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["resumed"] == len({x["idx"] for x in partial})
    raw = out.read_bytes().splitlines()
    rows = [json.loads(x) for x in raw]  # every line is valid JSON
    assert len(rows) == 13 and len({x["idx"] for x in rows}) == 13


@pytest.mark.parametrize("method, calls", [("baseline", 4), ("self-refine", 12)])
def test_baseline_methods_run_from_the_cli(tmp_path, method, calls):
    with ChatServer() as server:
        r = cli("run", str(DATA / "demo.jsonl"), "--method", method, "--out", str(tmp_path / "o.jsonl"),
                *remote(server))
        assert r.returncode == 0, r.stderr
        assert len(server.requests) == calls


def test_bench_pairs_methods_on_the_same_drafts_and_tracks_one_run(tmp_path):
    import mlflow

    out_dir = tmp_path / "bench"
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    with ChatServer() as server:
        r = cli("bench", str(DATA / "demo.jsonl"), "--methods", "self-refine,contextguard,contextguard-no-reminder",
                "--out-dir", str(out_dir), *remote(server, track=True), *judge_remote(server), "--tracking-uri", uri,
                "--experiment", "bench-test", "--judge-stability")
        assert r.returncode == 0, r.stderr
    names = {p.name for p in out_dir.iterdir()}
    for m in ("baseline", "self-refine", "contextguard", "contextguard-no-reminder"):
        assert {f"{m}.jsonl", f"{m}.graded.jsonl"} <= names
    base = {x["idx"]: x["model_output"] for x in read_rows(out_dir / "baseline.jsonl")}
    for m in ("self-refine", "contextguard-no-reminder"):
        for row in read_rows(out_dir / f"{m}.jsonl"):
            assert row["trace"]["draft"] == base[row["idx"]] and "draft" not in row["trace"]["cost"]
    rep = json.loads((out_dir / "report.json").read_text())
    assert list(rep["runs"]) == ["baseline", "self-refine", "contextguard", "contextguard (no reminder)"]  # as read
    assert set(rep["comparisons"]) == {"baseline -> self-refine", "baseline -> contextguard",
                                       "baseline -> contextguard (no reminder)"}
    assert rep["cost"]["baseline"]["lm_calls_per_task"] == 1.0
    md = (out_dir / "report.md").read_text()
    assert "## baseline -> contextguard" in md and "## baseline -> self-refine" in md
    # every rate with its interval, every pair with its paired test (all 4 demo tasks solved by each)
    assert rep["runs"]["contextguard"]["task_solving_rate_ci95"] == [51.01, 100.0]  # Wilson of 4/4
    pair = rep["comparisons"]["baseline -> contextguard"]
    assert (pair["delta_task_solving_rate"], pair["mcnemar_p"], pair["tasks_compared"]) == (0.0, 1.0, 4)
    assert "| baseline -> contextguard | 4 | +0.00 [" in md
    assert "| contextguard | 4 | 4 | 100.00 | [51.01, 100.00] |" in md
    assert rep["cost"]["self-refine"]["lm_calls_per_task"] == 2.0  # feedback + refine on the baseline draft
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["bench-test"], output_format="list")
    assert len(runs) == 1 and runs[0].data.metrics["contextguard.task_solving_rate"] == 100.0
    assert runs[0].data.metrics["contextguard.task_solving_rate.ci95_lo"] == 51.01
    assert runs[0].data.metrics["baseline vs contextguard.mcnemar_p"] == 1.0
    assert runs[0].data.metrics["baseline.cost.lm_calls_per_task"] == 1.0
    # --judge-stability: every vote drawn, so Table 5 is there for each method
    methods = ("baseline", "self-refine", "contextguard", "contextguard-no-reminder")
    assert all(len(v) == 3 for m in methods for x in read_rows(out_dir / f"{m}.graded.jsonl")
               for v in x["votes"])
    assert set(rep["judge_stability"]) == set(rep["runs"]) and "judge_stability_reason" not in rep
    assert rep["judge_stability"]["contextguard"]["requirement"]["single_vote_agreement"] == 100.0
    figures = {p.name for p in (out_dir / "figures").iterdir()}
    assert {"tsr_by_sub_category.png", "near_miss.png", "rubric_type_failure.png",
            "migration_contextguard.png", "migration_self_refine.png"} <= figures
    page = (out_dir / "report.html").read_text()
    assert page.count("<img ") == len(figures) and "Judge stability: contextguard" in page
    logged = {a.path for a in mlflow.MlflowClient().list_artifacts(runs[0].info.run_id, "bench")}
    assert {"bench/report.html", "bench/figures"} <= logged


def test_sigkill_mid_eval_then_rerun_grades_every_task_once(tmp_path):
    out, graded = tmp_path / "out.jsonl", tmp_path / "graded.jsonl"
    with ChatServer() as server:
        assert cli("run", str(DATA / "tasks.jsonl"), "--out", str(out), *remote(server)).returncode == 0
    with ChatServer(latency=0.1) as server:
        args = ["eval", str(out), "--out", str(graded), "--threads", "2", "--no-track", *judge_remote(server),
                "--no-cache", "--quiet"]
        proc = subprocess.Popen([sys.executable, "-m", "cg_dspy.cli", *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.time() + 60  # never hang CI if the child dies early
        while len(read_rows(graded)) < 3 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        server.latency = 0
        assert 3 <= len(read_rows(graded)) < 13
        assert cli(*args).returncode == 0
    rows = [json.loads(x) for x in graded.read_bytes().splitlines()]
    assert len(rows) == 13 and len({r["idx"] for r in rows}) == 13


def test_saved_programs_load_only_from_json(tmp_path):
    from cg_dspy.method.program import ContextGuard
    from cg_dspy.saved import load_program

    pickled = tmp_path / "program.pkl"
    pickled.write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(ValueError, match="refusing"):
        load_program(pickled)
    from cg_dspy.method.specialists import SpecialistPolicy

    saved = tmp_path / "p.json"
    policy = {"Rule System Application": SpecialistPolicy("rules", "separate")}
    ContextGuard(ablate=("guard",), max_rounds=2, policy=policy).save(str(saved))
    loaded = load_program(saved)
    assert loaded.ablate == ("guard",) and loaded.max_rounds == 2 and loaded.policy == policy
