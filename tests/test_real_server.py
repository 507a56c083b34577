"""A real third-party server: llama-cpp-python's own OpenAI-compatible server on the
bundled SmolLM2 GGUF, driven through `--model openai/... --api-base ...` as a user
would. It rejects OpenAI's `json_schema` response format (HTTP 500) and reads only
`max_tokens`, so this is where structured-output negotiation and the token limit
meet a server that is not ours.
"""

import json
import urllib.request

import pytest
from conftest import DATA, cli

from cg_dspy.clbench.store import read_rows

MAX_TOKENS = 192  # room for a demo answer and an audit; every reply on this single-slot server costs time


@pytest.fixture(scope="module")
def llama_server():
    pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (the dev extra)")
    from cg_dspy.lms import find_local_gguf
    from cg_dspy.testing import llama

    try:
        find_local_gguf()
    except RuntimeError:
        pytest.skip("embedded model not installed")
    # One thread to generate: a token is small work with a barrier per layer, and on
    # this shared 2-core machine a second thread mostly spins there against the other
    # test workers (prompts are still read on every core). The prompt cache on, as a
    # server for many requests is run: instructions the tasks share are read once.
    try:
        url, proc = llama.start_server("--n_threads", "1", "--cache", "true")
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def demo_run(llama_server, tmp_path_factory):
    """The demo run once through the server, then again in edit mode, as a user runs the
    two in turn with DSPy's cache on: every request of the first goes to the server
    (the cache starts empty; a retry is its own sample), and the second reuses the
    first's identical draft, audit and checker requests from the cache, so only its edit
    stage goes to the server. Both in this fixture: each test starts with the cache
    emptied. In memory only (a module fixture runs before the per-test isolation, when
    DSPy's default cache would write under the home directory). The tests below read,
    edit and grade these rows."""
    import dspy

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    dspy.cache.reset_memory_cache()
    folder = tmp_path_factory.mktemp("real")
    runs = {}
    for mode in ("rewrite", "edit"):
        out = folder / f"{mode}.jsonl"
        runs[mode] = out, cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--model", "openai/smollm",
                              "--api-base", llama_server, "--max-tokens", str(MAX_TOKENS), "--revision-mode", mode,
                              "--quiet", "--no-track")
        if runs[mode][1].returncode:
            break
    dspy.cache.reset_memory_cache()
    return runs


def test_demo_runs_through_llama_cpp_server_with_full_paths_and_the_token_limit(demo_run):
    out, r = demo_run["rewrite"]
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["finished"] == 4 and summary["failed"] == 0
    rows = read_rows(out)
    full = [x for x in rows if x["trace"]["path"] in ("revised", "rolled-back", "early-return")]
    assert len(full) >= 3, [x["trace"]["path"] for x in rows]
    assert summary["structured_output"] and set(summary["structured_output"]) == {"json_object"}
    for row in rows:
        for stage, cost in row["trace"]["cost"].items():
            assert cost["calls"] >= 1 and not cost["cached"], (row["idx"], stage, cost)  # all through the server
            assert cost["completion_tokens"] <= MAX_TOKENS * cost["calls"], (row["idx"], stage, cost)
        assert row["model_output"].strip() and "<think>" not in row["model_output"]


EXTRA_RUBRICS = 26  # demo-dk-1 has 4: graded jointly with 30, more than an audit list may hold (24)


@pytest.mark.parametrize("protocol", ["rubric", "joint"])
def test_the_judge_grades_through_llama_cpp_server_in_both_protocols_and_the_server_lives(
        llama_server, demo_run, tmp_path, protocol):
    """The rubric protocol judges each requirement in a call of its own; the joint one
    puts every rubric in one reply, whose status list must not be capped, so only it is
    given 30 (another 26 calls of the rubric protocol would show nothing new)."""
    out, r = demo_run["rewrite"]
    assert r.returncode == 0, r.stderr
    rows = sorted(read_rows(out), key=lambda row: row["idx"] != "demo-dk-1")  # rows are in finishing order
    if protocol == "joint":
        rows[0]["rubrics"] += [f"The response should mention point {i + 1} of the context."
                               for i in range(EXTRA_RUBRICS)]
        assert len(rows[0]["rubrics"]) == 30
    results, graded = tmp_path / "o.jsonl", tmp_path / "g.jsonl"
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    r = cli("eval", str(results), "--out", str(graded), "--judge-model", "openai/smollm", "--judge-api-base",
            llama_server, "--judge-max-tokens", "200", "--protocol", protocol, "--votes", "1", "--no-cache",
            "--quiet", "--no-track")
    assert r.returncode == 0, r.stderr
    by_id = {row["idx"]: row for row in read_rows(graded)}
    assert len(by_id) == 4 and not any(row.get("error") for row in by_id.values())
    assert [len(by_id[row["idx"]]["requirement_status"]) for row in rows] == [len(row["rubrics"]) for row in rows]
    if protocol == "joint":  # the status list is not capped at an audit list's 24 items
        assert "judge_note" not in by_id[rows[0]["idx"]], by_id[rows[0]["idx"]].get("judge_note")
    urllib.request.urlopen(f"{llama_server}/models", timeout=10).read()  # the server is alive


def test_edit_mode_revises_every_demo_draft_through_llama_cpp_server_and_its_edits_parse(demo_run):
    """Edit mode on the rewrite run's own drafts, audits and checks (`run --revision-mode
    edit` after `run`, DSPy's cache on): every task finished, the edit stage through
    the server, and its JSON parsed into edits."""
    first, r = demo_run["rewrite"]
    assert r.returncode == 0, r.stderr  # (the first run's own checks: the test above)
    out, r = demo_run["edit"]
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["finished"] == 4 and summary["failed"] == 0
    before = {row["idx"]: row["trace"] for row in read_rows(first)}
    rows = read_rows(out)
    assert {row["idx"]: row["trace"]["draft"] for row in rows} == {i: t["draft"] for i, t in before.items()}
    for row in rows:  # the same requests as the first run's: answered by the cache, not sent again
        trace = row["trace"]
        assert trace["audit"] == before[row["idx"]]["audit"], row["idx"]
        for stage, cost in trace["cost"].items():
            sent, cached = cost["calls"] >= 1 and not cost["cached"], cost["cached"] >= 1 and not cost["calls"]
            assert sent if stage == "edit" else cached, (row["idx"], stage, cost)
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
        cost = trace["cost"].get("edit")
        assert not cost or cost["completion_tokens"] <= MAX_TOKENS * cost["calls"]
    print(json.dumps({row["idx"]: [row["trace"]["path"], row["trace"].get("edits")] for row in rows}))
