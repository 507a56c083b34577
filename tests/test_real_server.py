"""A real third-party server: llama-cpp-python's own OpenAI-compatible server on the
bundled SmolLM2 GGUF, driven through `--model openai/... --api-base ...` as a user
would. It rejects OpenAI's `json_schema` response format (HTTP 500) and reads only
`max_tokens`, so this is where structured-output negotiation and the token limit
meet a server that is not ours.
"""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import DATA, cli

from cg_dspy.clbench.store import read_rows

MAX_TOKENS = 192  # room for a demo answer and an audit; every reply on this single-slot server costs time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server():
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the dev extra)")
    from cg_dspy.lms import find_local_gguf

    try:
        gguf = find_local_gguf()
    except RuntimeError:
        pytest.skip("embedded model not installed")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", "8192",
                             "--host", "127.0.0.1", "--port", str(port), "--n_threads", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("llama_cpp.server did not start")
            time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def demo_run(llama_server, tmp_path_factory):
    """The demo, run once through the server (the tests below read and grade it)."""
    out = tmp_path_factory.mktemp("real") / "o.jsonl"
    r = cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--model", "openai/smollm", "--api-base",
            llama_server, "--max-tokens", str(MAX_TOKENS), "--no-cache", "--quiet", "--no-track")
    return out, r


def test_demo_runs_through_llama_cpp_server_with_full_paths_and_the_token_limit(demo_run):
    out, r = demo_run
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["finished"] == 4 and summary["failed"] == 0
    rows = read_rows(out)
    full = [x for x in rows if x["trace"]["path"] in ("revised", "rolled-back", "early-return")]
    assert len(full) >= 3, [x["trace"]["path"] for x in rows]
    assert summary["structured_output"] and set(summary["structured_output"]) == {"json_object"}
    for row in rows:
        for stage, cost in row["trace"]["cost"].items():
            assert cost["calls"] >= 1
            assert cost["completion_tokens"] <= MAX_TOKENS * cost["calls"], (row["idx"], stage, cost)
        assert row["model_output"].strip() and "<think>" not in row["model_output"]


EXTRA_RUBRICS = 26  # demo-dk-1 has 4: graded with 30, more than an audit list may hold (24)


@pytest.mark.parametrize("protocol", ["rubric", "joint"])
def test_the_judge_grades_through_llama_cpp_server_in_both_protocols_and_the_server_lives(
        llama_server, demo_run, tmp_path, protocol):
    out, r = demo_run
    assert r.returncode == 0, r.stderr
    rows = sorted(read_rows(out), key=lambda row: row["idx"] != "demo-dk-1")  # rows are in finishing order
    rows[0]["rubrics"] += [f"The response should mention point {i + 1} of the context." for i in range(EXTRA_RUBRICS)]
    results, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    r = cli("eval", str(results), "--out", str(graded), "--judge-model", "openai/smollm", "--judge-api-base",
            llama_server, "--judge-max-tokens", "200", "--protocol", protocol, "--votes", "1", "--no-cache",
            "--quiet", "--no-track")
    assert r.returncode == 0, r.stderr
    by_id = {row["idx"]: row for row in read_rows(graded)}
    assert len(by_id) == 4 and not any(row.get("error") for row in by_id.values())
    assert [len(by_id[row["idx"]]["requirement_status"]) for row in rows] == [len(row["rubrics"]) for row in rows]
    assert len(rows[0]["rubrics"]) == 30
    if protocol == "joint":  # the status list is not capped at an audit list's 24 items
        assert "judge_note" not in by_id[rows[0]["idx"]], by_id[rows[0]["idx"]].get("judge_note")
    urllib.request.urlopen(f"{llama_server}/models", timeout=10).read()  # the server is alive


def test_edit_mode_revises_every_demo_draft_through_llama_cpp_server_and_its_edits_parse(llama_server, demo_run,
                                                                                          tmp_path):
    """Edit mode on the demo run's own drafts (as `bench` pairs it with the rewrite): the
    audit, checkers and edit stage through the server, every task finished."""
    from cg_dspy.clbench import generation
    from cg_dspy.clbench.data import load_tasks
    from cg_dspy.lms import LMSettings, build_lm
    from cg_dspy.method import build_program

    drafts = {row["idx"]: row["trace"]["draft"] for row in read_rows(demo_run[0])}
    # 160 tokens: room for an audit and an edit list of a demo answer (a cut one is handled), and a third less
    # time than the run's 256 on this single-slot server
    lm = build_lm(LMSettings(model="openai/smollm", api_base=llama_server, max_tokens=160, cache=False))
    result = generation.run(build_program("contextguard-edit"), load_tasks(DATA / "demo.jsonl").tasks,
                            tmp_path / "edit.jsonl", lm=lm, method="contextguard-edit", drafts=drafts, progress=False)
    assert result.summary["finished"] == 4 and not result.outcome.failed
    rows = read_rows(tmp_path / "edit.jsonl")
    assert {row["idx"]: row["trace"]["draft"] for row in rows} == drafts
    edited = [row for row in rows if "edit" in row["trace"]["cost"]]
    assert edited, [row["trace"]["path"] for row in rows]  # the edit stage ran on the real server
    assert any(row["trace"].get("edits") is not None for row in edited)  # and its JSON parsed into edits
    for row in rows:
        trace = row["trace"]
        assert trace["path"] in ("revised", "no-edit", "rolled-back", "early-return", "stage-failed")
        if trace["path"] != "revised":
            assert row["model_output"] == trace["draft"]  # nothing applied: the draft, byte for byte
        elif trace.get("edits"):
            assert trace["edits"]["applied"]
    print(json.dumps({row["idx"]: [row["trace"]["path"], row["trace"].get("edits")] for row in rows}))
