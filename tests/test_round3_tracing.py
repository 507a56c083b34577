"""Round three of the hostile pass, second half: tracing never hangs or lies, a regrade
replaces the verdicts, interrupts end cleanly, pages are readable, and the odd inputs a
real store and a real server produce (the first half: test_round3.py; split so the two
halves run on two workers).

Each test names the numbered item of the issue it covers (L: the low-severity list); all
run the real CLI against the project's test server and a real MLflow store.
"""

import json
import os
import signal
import time

import mlflow
import pytest
from conftest import DATA, cli, spawn, verdicts_on
from table14 import table14_rows
from test_round3 import DEMO, _registry, alive, judging, remote, wait_for_requests, writer_of

from cg_dspy.clbench.store import read_rows
from cg_dspy.testing.server import ChatServer

# --- 6. tracing never hangs or lies ----------------------------------------------------


def test_6_a_killed_writer_is_reported_exactly_and_eval_says_what_it_skipped(tmp_path):
    uri = f"sqlite:///{tmp_path}/t.db"
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer(latency=0.3) as server:
        proc = spawn("run", str(DEMO), "--out", str(out), "--threads", "1", "--tracking-uri", uri,
                     *remote(server, track=True))
        wait_for_requests(server)
        os.kill(writer_of(proc.pid), signal.SIGKILL)
        server.latency = 0  # slow replies only kept the run going until the writer was killed
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr  # every row is there; only traces were lost
        summary = json.loads(stdout)
        assert summary["finished"] == 4 and summary["traces"]["sent"] == 4
        _registry(uri)
        run = mlflow.search_runs(experiment_names=["contextguard"], output_format="list")[0]
        stored = len(mlflow.search_traces(locations=[run.info.experiment_id], return_type="list"))
        assert summary["traces"]["stored"] == stored and summary["traces"]["lost"] == 4 - stored > 0
        assert f"{4 - stored} of 4 traces were not stored" in stderr
        assert run.data.metrics["traces.lost"] == 4 - stored and run.info.status == "FINISHED"
        r = cli("eval", str(out), "--out", str(graded), "--tracking-uri", uri, *judging(server, track=True))
        assert r.returncode == 0, r.stderr
        assert f"the verdicts of {4 - stored} of 4 graded tasks were not stored" in r.stderr


def test_6_a_stopped_writer_never_hangs_a_run_and_ctrl_c_while_waiting_ends_cleanly(tmp_path):
    uri = f"sqlite:///{tmp_path}/t.db"
    with ChatServer(latency=0.2) as server:
        proc = spawn("run", str(DEMO), "--out", str(tmp_path / "a.jsonl"), "--threads", "1", "--tracking-uri", uri,
                     *remote(server, track=True), env={"CG_TRACE_STALL_SECONDS": "3"})
        wait_for_requests(server)
        writer = writer_of(proc.pid)
        os.kill(writer, signal.SIGSTOP)
        server.latency = 0  # slow replies only kept the run going until the writer was stopped
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0 and json.loads(stdout)["traces"]["stored"] == 0
        assert "stored nothing for 3 s and was stopped" in stderr and not alive(writer)
        server.latency = 0.2  # slow again: the second run must still be running when its writer is stopped
        proc = spawn("run", str(DEMO), "--out", str(tmp_path / "b.jsonl"), "--threads", "1", "--tracking-uri", uri,
                     *remote(server, track=True))
        n = len(server.requests)
        wait_for_requests(server, n + 1)
        writer = writer_of(proc.pid)
        os.kill(writer, signal.SIGSTOP)
        server.latency = 0  # slow replies only kept the run going until the writer was stopped
        while len(read_rows(tmp_path / "b.jsonl")) < 4 and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(0.5)  # now waiting for the writer
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "stopped early" in stderr.lower() and "Traceback" not in stderr
    assert not alive(writer)  # no orphan
    _registry(uri)
    statuses = {r.info.run_name: r.info.status for r in mlflow.search_runs(experiment_names=["contextguard"],
                                                                            output_format="list")}
    assert statuses == {"run-a": "FINISHED", "run-b": "KILLED"}


def test_6_an_unreachable_tracking_server_is_one_clear_line_at_once(tmp_path):
    start = time.time()
    with ChatServer() as server:
        r = cli("run", str(DEMO), "--out", str(tmp_path / "o.jsonl"), "--tracking-uri", "http://127.0.0.1:9",
                *remote(server, track=True))
        assert r.returncode == 2 and "does not answer" in r.stderr and "internal error" not in r.stderr
        assert server.requests == [] and time.time() - start < 60


# --- 11. a regrade replaces the verdicts -----------------------------------------------


def test_11_regrading_after_the_rubrics_changed_leaves_no_stale_assessment(tmp_path):
    uri = f"sqlite:///{tmp_path}/t.db"
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        assert cli("run", str(DEMO), "--out", str(out), "--method", "baseline", "--tracking-uri", uri,
                   *remote(server, track=True)).returncode == 0
        assert cli("eval", str(out), "--out", str(graded), "--tracking-uri", uri,
                   *judging(server, track=True)).returncode == 0
        rows = read_rows(out)
        dk = next(r for r in rows if r["idx"] == "demo-dk-1")
        dk["rubrics"] = ["The response should greet the parent.", dk["rubrics"][0]]  # 4 rubrics -> 2
        edited = tmp_path / "edited.jsonl"
        edited.write_text("".join(json.dumps(r) + "\n" for r in rows))
        r = cli("eval", str(edited), "--out", str(graded), "--tracking-uri", uri, *judging(server, track=True))
        assert r.returncode == 0, r.stderr
    _registry(uri)
    from cg_dspy.tracking import trace_ids

    run = next(r for r in mlflow.search_runs(experiment_names=["contextguard"], output_format="list")
               if r.data.tags["cg_dspy.kind"] == "run")
    trace = mlflow.get_trace(trace_ids(run.info.run_id)["demo-dk-1"])
    assert [a.metadata["rubric"] for a in verdicts_on(trace)] == dk["rubrics"]
    assert sorted(a.name for a in trace.info.assessments if not a.name.startswith("requirement/")) == \
        ["rubric_pass_rate", "rubrics", "task_solved"]  # one of each: the first grading's are gone
    assert next(a for a in trace.info.assessments if a.name == "rubrics").value == dk["rubrics"]


# --- L. interrupts end cleanly, pages are readable, odd tags and replies -------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_L_an_interrupted_bench_ends_130_with_its_run_killed(tmp_path, sig):
    uri = f"sqlite:///{tmp_path}/t.db"
    with ChatServer(latency=0.3) as server:
        proc = spawn("bench", str(DEMO), "--methods", "baseline", "--out-dir", str(tmp_path / "b"), "--threads", "1",
                     "--tracking-uri", uri, *remote(server, track=True), *judging(server, track=True))
        wait_for_requests(server)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Rerun the same command" in stderr and "Traceback" not in stderr
    _registry(uri)
    assert [r.info.status for r in mlflow.search_runs(experiment_names=["contextguard"], output_format="list")] == [
        "KILLED"]


def test_L_an_interrupted_optimize_ends_130_with_its_run_killed(tmp_path):
    uri = f"sqlite:///{tmp_path}/t.db"
    manifest = tmp_path / "s.json"
    assert cli("split", str(DATA / "tasks.jsonl"), "--out", str(manifest), "--fractions", "0.4,0.3,0.3").returncode == 0
    with ChatServer(latency=0.3) as server:
        proc = spawn("optimize", "--optimizer", "bootstrap", "--train", f"{manifest}#train", "--dev",
                     f"{manifest}#dev", "--out", str(tmp_path / "p.json"), "--threads", "1", "--tracking-uri", uri,
                     *remote(server, track=True), *judging(server, track=True))
        wait_for_requests(server, 3)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "stopped early" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "p.json").exists()
    _registry(uri)
    assert [r.info.status for r in mlflow.search_runs(experiment_names=["contextguard"], output_format="list")] == [
        "KILLED"]


def test_L_pages_and_figures_are_readable_by_others_and_markdown_carries_no_raw_html(tmp_path):
    before, after = table14_rows()
    for row in before[:5] + after[:5]:
        row["metadata"]["context_category"] = "<script>alert(1)</script>"
    files = {tmp_path / "b.jsonl": before, tmp_path / "a.jsonl": after}
    for path, rows in files.items():
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("report", *map(str, files), "--plots", str(tmp_path / "figs"), "--html", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    assert "<script>" not in r.stdout and "&lt;script>alert(1)&lt;/script>" in r.stdout
    umask = os.umask(0)
    os.umask(umask)
    for path in [tmp_path / "r.html", *(tmp_path / "figs").iterdir()]:
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask & ~0o111, path


def test_L_odd_registry_tags_are_named_or_shown_as_missing(store, tmp_path):
    version = mlflow.genai.register_prompt("contextguard.audit", "Audit.", tags={"variant": "base", "demos": "0"})
    version2 = mlflow.genai.register_prompt("contextguard.audit", "Audit well.", tags={
        "variant": "tuned", "demos": "many", "dev_tsr": "NaN", "cg_dspy_config": "{not json"})
    mlflow.genai.set_prompt_alias("contextguard.audit", "odd", int(version2.version))
    r = cli("compare", "--tracking-uri", store, "--experiment", "cg-test", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["stages"]["audit"]["versions"]
    assert [(v["version"], v["demos"], v["dev_after"]) for v in rows] == [(int(version.version), 0, None),
                                                                         (int(version2.version), None, None)]
    r = cli("run", str(DEMO), "--out", str(tmp_path / "o.jsonl"), "--program", "prompts:/contextguard@odd",
            "--tracking-uri", store, "--no-track")
    assert r.returncode == 2 and "tag cg_dspy_config is not JSON" in r.stderr


@pytest.mark.parametrize("said", ["Yes.", "YES", "y", " yes "])
def test_L_a_judge_that_ignores_the_schema_case_is_still_read(tmp_path, said):
    out, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        assert cli("run", str(DEMO), "--out", str(out), "--method", "baseline", *remote(server)).returncode == 0
        server.inject("text", text=json.dumps({"reason": "fine", "satisfaction_status": said}), times=1000,
                      match="satisfaction_status")
        r = cli("eval", str(out), "--out", str(graded), *judging(server))
        assert r.returncode == 0, r.stderr
    assert all(row["score"] == 1 for row in read_rows(graded))
