"""Round two of the hostile pass: untrusted programs, outputs that are not ours, two
writers, resume that notices change, CL-bench's own variants, clean errors, secrets.

Each test names the numbered item of the issue it covers; all run the real CLI against
the project's test server.
"""

import json
import subprocess
import sys
import time

import pytest
from conftest import DATA, cli

from cg_dspy.clbench.store import read_rows
from cg_dspy.method.program import ContextGuard
from cg_dspy.testing.server import ChatServer

DEMO = DATA / "demo.jsonl"
PT = "Harbor Lane"  # text only demo-pt-1 contains


def remote(server, *extra):
    return ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet", "--no-track",
            *extra]


def judging(server, *extra):
    return ["--judge-model", "openai/test-model", "--judge-api-base", server.base_url, "--no-cache", "--quiet",
            "--no-track", *extra]


def run_demo(server, out, *extra, source=DEMO):
    return cli("run", str(source), "--out", str(out), *remote(server, *extra))


# --- 1. a saved program is data ------------------------------------------------------


def saved_program(tmp_path, **predictor_extra):
    state = ContextGuard().dump_state()
    state["audit"].update(predictor_extra)
    path = tmp_path / "program.json"
    path.write_text(json.dumps(state))
    return path


@pytest.mark.parametrize("extra, named", [
    ({"config": {"api_base": "ATTACKER"}}, "audit.config"),
    ({"config": {"base_url": "ATTACKER"}}, "audit.config"),
    ({"lm": {"model": "openai/other-model", "api_base": "ATTACKER"}}, "audit.lm"),
])
def test_1_a_program_cannot_redirect_calls_or_swap_the_model(tmp_path, extra, named):
    with ChatServer() as attacker, ChatServer() as server:
        text = json.dumps(extra).replace("ATTACKER", attacker.base_url)
        program = saved_program(tmp_path, **json.loads(text))
        r = run_demo(server, tmp_path / "o.jsonl", "--program", str(program))
        assert r.returncode == 2 and named in r.stderr and "Traceback" not in r.stderr
        assert server.requests == [] and attacker.requests == []
        r = run_demo(server, tmp_path / "o.jsonl", "--program", str(program), "--lenient-program")
        assert r.returncode == 0, r.stderr
        assert attacker.requests == [] and len(server.requests) == 10  # every call went where --api-base says
        assert {b["model"] for b in server.requests} == {"test-model"}


def test_1_program_blocks_are_validated(tmp_path):
    state = ContextGuard().dump_state()
    cases = {"max_rounds": 1_000_000_000, "method": "rm -rf", "ablate": ["everything"], "min_length_ratio": 7}
    with ChatServer() as server:
        for key, value in cases.items():
            path = tmp_path / f"{key}.json"
            path.write_text(json.dumps({**state, "cg_dspy": {**state["cg_dspy"], key: value}}))
            r = run_demo(server, tmp_path / "o.jsonl", "--program", str(path))
            assert r.returncode == 2 and f"cg_dspy.{key}" in r.stderr, (key, r.stderr)
        path = tmp_path / "demos.json"
        path.write_text(json.dumps({**state, "audit": {**state["audit"], "demos": [{"conversation": [],
                                                                                    "api_key": "x"}]}}))
        r = run_demo(server, tmp_path / "o.jsonl", "--program", str(path))
        assert r.returncode == 2 and "audit.demos[0]" in r.stderr
        assert server.requests == []


def test_1_a_saved_program_still_round_trips(tmp_path):
    from cg_dspy.saved import load_program

    program = ContextGuard(ablate=("guard",), max_rounds=2)
    program.revise.signature = program.revise.signature.with_instructions("Fix only the fix set.")
    program.audit.demos = [{"previous_answer": "a", "possibly_missed": [], "augmented": True}]
    program.save(str(tmp_path / "p.json"))
    loaded = load_program(tmp_path / "p.json")
    assert loaded.revise.signature.instructions == "Fix only the fix set."
    assert loaded.audit.demos == [{"previous_answer": "a", "possibly_missed": [], "augmented": True}]
    assert loaded.ablate == ("guard",) and loaded.max_rounds == 2


# --- 2. outputs that are not ours, 3. rounds, 13. bad numbers -----------------------


def test_2_out_never_rewrites_a_file_that_is_not_ours(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(DEMO.read_bytes() + b"# a comment line\n")
    with ChatServer() as server:
        r = run_demo(server, notes)
        assert r.returncode == 2 and "pass --force" in r.stderr and notes.read_text() == "my notes\n"
        r = run_demo(server, tasks, source=tasks)
        assert r.returncode == 2 and "input of this run" in r.stderr
        assert tasks.read_bytes() == DEMO.read_bytes() + b"# a comment line\n"
        r = run_demo(server, tmp_path)
        assert r.returncode == 2 and "is a directory" in r.stderr
        results = tmp_path / "o.jsonl"
        assert run_demo(server, results).returncode == 0
        before = results.read_bytes()
        r = cli("eval", str(results), "--out", str(results), *judging(server))
        assert r.returncode == 2 and results.read_bytes() == before
        r = cli("eval", str(results), "--out", str(tmp_path / "o.jsonl.other"), *judging(server))
        assert r.returncode == 0, r.stderr
        r = cli("eval", str(results), "--out", str(results.with_suffix(".jsonl.other")), *judging(server))
        assert r.returncode == 0  # resuming our own graded file is fine
        r = run_demo(server, notes, "--force")
        assert r.returncode == 0 and len(read_rows(notes)) == 4  # --force replaces it, as asked
        assert server.requests
    r = cli("split", str(tasks), "--out", str(tasks))
    assert r.returncode == 2 and "input of this run" in r.stderr
    r = cli("split", str(DEMO), "--out", str(notes))
    assert r.returncode == 2 and "not a split manifest" in r.stderr


@pytest.mark.parametrize("flags, says", [
    (["--max-rounds", "1000000000"], "from 1 to 5"),
    (["--threads", "0"], "at least 1"),
    (["--max-tokens", "-5"], "at least 1"),
])
def test_3_13_unbounded_or_zero_numbers_are_refused_before_any_call(tmp_path, flags, says):
    with ChatServer() as server:
        r = run_demo(server, tmp_path / "o.jsonl", *flags)
        assert r.returncode == 2 and says in r.stderr and server.requests == []


@pytest.mark.parametrize("votes, says", [("0", "at least 1"), ("2", "tie"), ("4", "tie")])
def test_13_votes_must_be_a_positive_odd_k(tmp_path, votes, says):
    with ChatServer() as server:
        assert run_demo(server, tmp_path / "o.jsonl").returncode == 0
        n = len(server.requests)
        r = cli("eval", str(tmp_path / "o.jsonl"), "--out", str(tmp_path / "g.jsonl"), "--votes", votes,
                *judging(server))
        assert r.returncode == 2 and says in r.stderr and len(server.requests) == n


@pytest.mark.parametrize("body", [b"", b"\n\n  \n"])
def test_13_an_empty_input_is_unusable(tmp_path, body):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(body)
    with ChatServer() as server:
        r = run_demo(server, tmp_path / "o.jsonl", source=empty)
        assert r.returncode == 2 and "holds no tasks" in r.stderr


# --- 4. one writer per output --------------------------------------------------------


def test_4_a_second_writer_is_told_who_holds_the_output_and_exits_2(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer(latency=0.3) as server:
        args = [sys.executable, "-m", "cg_dspy.cli", "run", str(DATA / "tasks.jsonl"), "--out", str(out),
                "--threads", "1", *remote(server)]
        first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not read_rows(out) and time.time() < deadline and first.poll() is None:
            time.sleep(0.05)
        second = cli("run", str(DATA / "tasks.jsonl"), "--out", str(out), "--threads", "1", *remote(server))
        assert second.returncode == 2 and f"is being written by pid {first.pid}" in second.stderr
        server.latency = 0  # the slow replies only kept the first one writing while the second tried
        assert first.wait(timeout=120) == 0
        again = cli(*args[3:])
        assert again.returncode == 0 and json.loads(again.stdout)["resumed"] == 13
    rows = read_rows(out)
    assert len(rows) == 13 and len({r["idx"] for r in rows}) == 13


# --- 5. resume knows its run ---------------------------------------------------------


def test_5_a_rerun_with_other_settings_is_refused_or_says_what_differs(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer() as server:
        assert run_demo(server, out).returncode == 0
        r = run_demo(server, out, "--method", "baseline")
        assert r.returncode == 2 and 'method: "contextguard" -> "baseline"' in r.stderr
        r = run_demo(server, out, "--ablate", "protection")
        assert r.returncode == 2 and "protection" in r.stderr
        r = run_demo(server, out, "--temperature", "0.7")
        assert r.returncode == 2 and "task_lm.temperature" in r.stderr
        n = len(server.requests)
        r = run_demo(server, out, "--method", "baseline", "--resume-anyway")
        assert r.returncode == 0 and json.loads(r.stdout)["resumed"] == 4 and len(server.requests) == n
        assert "other settings (--resume-anyway)" in r.stderr and '"contextguard" -> "baseline"' in r.stderr
        r = run_demo(server, out, "--method", "baseline", "--force")
        assert r.returncode == 0 and json.loads(r.stdout)["resumed"] == 0
        assert {x["method"] for x in read_rows(out)} == {"baseline"} and len(server.requests) == n + 4


def test_5_a_task_whose_input_changed_is_done_again(tmp_path):
    out, tasks = tmp_path / "o.jsonl", tmp_path / "tasks.jsonl"
    tasks.write_bytes(DEMO.read_bytes())
    with ChatServer() as server:
        assert run_demo(server, out, "--method", "baseline", source=tasks).returncode == 0
        rows = [json.loads(line) for line in tasks.read_text().splitlines()]
        rows[2]["rubrics"].append("The response should name the manager.")
        tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
        n = len(server.requests)
        r = run_demo(server, out, "--method", "baseline", source=tasks)
        assert r.returncode == 0 and json.loads(r.stdout)["resumed"] == 3 and len(server.requests) == n + 1
    changed = {x["idx"]: x for x in read_rows(out)}[rows[2]["metadata"]["task_id"]]
    assert changed["rubrics"][-1] == "The response should name the manager."


# --- 6, 7. readers lose nothing silently; duplicates and mixed methods --------------


def test_6_readers_read_a_last_line_without_newline_and_name_bad_lines(tmp_path):
    results, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        assert run_demo(server, results, "--method", "baseline").returncode == 0
        lines = results.read_bytes().splitlines()
        broken = tmp_path / "broken.jsonl"
        broken.write_bytes(lines[0] + b"\n{not json\n" + b"\n".join(lines[1:]))  # no final newline
        r = cli("eval", str(broken), "--out", str(graded), *judging(server))
        assert r.returncode == 1 and f"{broken}:2:" in r.stderr
        assert len(read_rows(graded)) == 4  # every readable task, the last line included
        glines = graded.read_bytes().splitlines()
        graded_broken = tmp_path / "gb.jsonl"
        graded_broken.write_bytes(b"\n".join(glines[:2] + [b"[1, 2]"] + glines[2:]))
        r = cli("report", str(graded_broken), "--format", "json")
        assert r.returncode == 1 and f"{graded_broken}:3:" in r.stderr
        assert json.loads(r.stdout)["runs"]["baseline"]["tasks"] == 4


def test_7_duplicate_ids_are_named_and_mixed_methods_are_separate_runs(tmp_path):
    with ChatServer() as server:
        for method in ("baseline", "self-refine"):
            assert run_demo(server, tmp_path / f"{method}.jsonl", "--method", method).returncode == 0
            assert cli("eval", str(tmp_path / f"{method}.jsonl"), "--out", str(tmp_path / f"{method}.g.jsonl"),
                       *judging(server)).returncode == 0
    merged = tmp_path / "merged.jsonl"
    merged.write_bytes((tmp_path / "baseline.g.jsonl").read_bytes() + (tmp_path / "self-refine.g.jsonl").read_bytes())
    r = cli("report", str(merged), "--format", "json")
    assert r.returncode == 1 and "duplicate task id (also on line 1)" in r.stderr  # same ids, two methods
    twice = tmp_path / "twice.jsonl"
    twice.write_bytes((tmp_path / "baseline.g.jsonl").read_bytes() * 2)
    for _ in range(2):  # the same answer every time
        r = cli("report", str(twice), "--format", "json")
        assert r.returncode == 1 and json.loads(r.stdout)["runs"]["baseline"]["tasks"] == 4
    r = cli("report", str(tmp_path / "baseline.g.jsonl"), str(tmp_path / "self-refine.g.jsonl"), "--format", "json")
    assert r.returncode == 0 and set(json.loads(r.stdout)["runs"]) == {"baseline", "self-refine"}


# --- 8. transient is not permanent ---------------------------------------------------


def test_8_an_unparseable_judge_is_a_failure_that_the_next_eval_regrades(tmp_path):
    results, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        assert run_demo(server, results, "--method", "baseline").returncode == 0
        server.inject("text", text="I cannot decide.", match="should not give any dose", times=100)
        r = cli("eval", str(results), "--out", str(graded), *judging(server))
        assert r.returncode == 1 and "failed to grade demo-dk-1" in r.stderr and "after 3 tries" in r.stderr
        bad = {x["idx"]: x for x in read_rows(graded)}["demo-dk-1"]
        assert bad["error"] and bad["score"] == 0
        server.faults.clear()
        n = len(server.requests)
        r = cli("eval", str(results), "--out", str(graded), *judging(server))
        assert r.returncode == 0 and len(server.requests) - n == 4 * 2  # only demo-dk-1's rubrics, 2 votes each
    rows = {x["idx"]: x for x in read_rows(graded)}
    assert len(rows) == 4 and rows["demo-dk-1"]["score"] == 1 and not rows["demo-dk-1"].get("error")


# --- 9, 11. CL-bench's own variants and its scoring rule -----------------------------


def test_9_rubric_dicts_are_read_everywhere(tmp_path):
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    for row in rows:
        row["rubrics"] = [{"rubric_criteria": r} for r in row["rubrics"]]
    tasks, results, graded = tmp_path / "t.jsonl", tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ChatServer() as server:
        assert run_demo(server, results, "--method", "baseline", source=tasks).returncode == 0
        r = cli("eval", str(results), "--out", str(graded), *judging(server))
        assert r.returncode == 0, r.stderr
        judged = [b["messages"][-1]["content"] for b in server.requests if "satisfaction_status" in str(b)]
        assert judged and not any("rubric_criteria" in text for text in judged)
        assert any("exactly three bullet points" in text for text in judged)
    r = cli("report", str(graded), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["runs"]["baseline"]["tasks"] == 4


def graded_row(idx, status, score, rubrics=("a", "b")):
    row = {"idx": idx, "messages": [{"role": "user", "content": "q"}], "model_output": "x", "rubrics": list(rubrics),
           "metadata": {"task_id": idx, "context_category": "Rule System Application", "sub_category": "Games"},
           "requirement_status": status}
    if score is not None:
        row["score"] = score
    return row


def test_11_scoring_follows_cl_bench(tmp_path):
    path = tmp_path / "g.jsonl"
    rows = [graded_row("true-status", [True, "YES"], None),  # statuses as booleans / any case
            graded_row("ones", [1, 1], None),
            graded_row("score-only", [], 1),  # CL-bench rows: the score decides
            graded_row("score-zero", ["yes", "yes"], 0),  # the score wins; the statuses are noted
            graded_row("no", ["yes", "no"], None)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("report", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    run = json.loads(r.stdout)["runs"]["g.jsonl"]
    assert (run["tasks"], run["solved"]) == (5, 3)
    assert run["near_miss"] == {"0": 4, "1": 1, "2-3": 0, "4-8": 0, ">8": 0}
    assert run["score_disagrees_with_statuses"] == 1


# --- 10. clean errors, 12. secrets, 14. minor ----------------------------------------


@pytest.mark.parametrize("bad, field", [
    ({"requirement_status": 3}, "requirement_status"),
    ({"metadata": ["a"]}, "metadata"),
    ({"messages": [{"role": "user", "content": ["part"]}]}, "messages.0.content"),
    ({"messages": [{"role": "user"}]}, "messages.0.content"),
    ({"votes": [[None, "yes"]]}, "votes.0.0"),
    ({"cost": {"stages": {"draft": {"calls": "many"}}}}, "cost.stages.draft.calls"),
    ({"score": "high"}, "score"),
])
def test_10_malformed_graded_rows_are_named_not_tracebacks(tmp_path, bad, field):
    path = tmp_path / "g.jsonl"
    good = graded_row("ok", ["yes", "yes"], 1)
    path.write_text(json.dumps(good) + "\n" + json.dumps({**graded_row("bad", ["yes"], 1), **bad}) + "\n")
    r = cli("report", str(path), "--format", "json")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{path}:2: task bad: " in r.stderr and field in r.stderr
    assert json.loads(r.stdout)["runs"]["g.jsonl"]["tasks"] == 1


def test_10_directories_and_wrong_types_get_one_line(tmp_path):
    folder = tmp_path / "folder.json"
    folder.mkdir()
    (tmp_path / "wrong.json").write_text(json.dumps({"cg_dspy": {"max_rounds": "two"}}))
    cases = [("eval", str(folder), "--out", str(tmp_path / "g.jsonl"), "--judge-model", "openai/x",
              "--judge-api-base", "http://127.0.0.1:9/v1", "--no-track"),
             ("report", str(folder)),
             ("run", str(DEMO), "--out", str(tmp_path / "o.jsonl"), "--program", str(folder)),
             ("run", str(DEMO), "--out", str(tmp_path / "o.jsonl"), "--program", str(tmp_path / "wrong.json")),
             ("split", str(DEMO), "--out", str(folder))]
    for args in cases:
        r = cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("contextguard: "), r.stderr


def test_12_keys_echoed_by_a_server_are_scrubbed_from_rows_and_stderr(tmp_path, monkeypatch):
    secret = "sk-live-0123456789abcdefSECRET"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    with ChatServer() as server:
        server.inject("status", status=400, match=PT, times=100, echo_auth=True)
        r = run_demo(server, tmp_path / "o.jsonl")
        assert r.returncode == 1 and "failed task demo-pt-1" in r.stderr
    assert secret not in r.stderr and secret not in r.stdout and "Authorization: Bearer ***" in r.stderr
    assert secret.encode() not in (tmp_path / "o.jsonl").read_bytes()


def test_12_scrub_takes_keys_out_of_text_and_secret_names_out_of_settings():
    from cg_dspy.core.redact import redact, scrub

    assert scrub("Authorization: Bearer abcdef123456, then Bearer zzzzzz999 and api_key=hunter2hunter", []) == \
        "Authorization: Bearer ***, then Bearer *** and api_key=***"
    assert scrub("key sk-abc-12345678 here", ["sk-abc-12345678"]) == "key *** here"
    settings = {"max_tokens": 5, "api_key": "x", "task_lm": {"api_key": "y", "model": "m"}, "token": "t"}
    assert redact(settings, []) == {"max_tokens": 5, "api_key": "***", "task_lm": {"api_key": "***", "model": "m"},
                                    "token": "***"}


def test_14_ids_cannot_forge_lines_and_read_only_commands_create_no_store(tmp_path):
    rows = [json.loads(line) for line in DEMO.read_text().splitlines()]
    rows[0]["metadata"]["task_id"] = "evil\nfailed task demo-rs-1: forged | cell"
    rows[0]["metadata"]["sub_category"] = "a | b\nc"
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with ChatServer() as server:
        server.inject("status", status=503, match="Brightwater", times=100)
        r = run_demo(server, tmp_path / "o.jsonl", "--retries", "0", source=tasks)
    assert r.returncode == 1
    failed = [line for line in r.stderr.splitlines() if line.startswith("failed task")]
    assert len(failed) == 1 and failed[0].startswith("failed task evil\\nfailed task demo-rs-1: forged | cell: ")
    graded = tmp_path / "g.jsonl"
    graded.write_text(json.dumps({**graded_row("x", ["yes"], 1, ["a"]),
                                  "metadata": {"task_id": "x", "sub_category": "a | b\nc"}}) + "\n")
    r = cli("report", str(graded))
    assert "| a \\| b c |" in r.stdout
    store = tmp_path / "nowhere.db"
    r = cli("compare", "--tracking-uri", f"sqlite:///{store}")
    assert r.returncode == 2 and "no MLflow store" in r.stderr and not store.exists()
    r = cli("run", str(DEMO), "--out", str(tmp_path / "p.jsonl"), "--program", "runs:/abc",
            "--tracking-uri", f"sqlite:///{store}")
    assert r.returncode == 2 and not store.exists()


def test_14_an_interrupted_eval_says_how_to_resume(tmp_path):
    import signal

    results, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    with ChatServer() as server:
        assert cli("run", str(DATA / "tasks.jsonl"), "--out", str(results), "--method", "baseline",
                   *remote(server)).returncode == 0
    with ChatServer(latency=0.2) as server:
        args = [sys.executable, "-m", "cg_dspy.cli", "eval", str(results), "--out", str(graded), "--threads", "1",
                *judging(server)]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not read_rows(graded) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Rerun the same command to resume" in stderr
