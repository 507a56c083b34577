"""What reaches a real OpenAI-compatible server, and how its replies are read.

The project's test server plays the servers and models people run: a vLLM-like
server, llama-cpp-python's server (rejects `json_schema`, reads only `max_tokens`),
reasoning models with and without a reasoning parser, replies cut at the limit.
"""

import json

import pytest
from conftest import DATA, cli

from cg_dspy.clbench.data import load_tasks
from cg_dspy.clbench.store import read_rows
from cg_dspy.lms.replies import split_reasoning
from cg_dspy.testing.server import ChatServer, default_reply

DEMO = str(DATA / "demo.jsonl")


def remote(server, *extra):
    return ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet", "--no-track",
            *extra]


def judge_flags(server):
    return ["--judge-model", "openai/test-model", "--judge-api-base", server.base_url, "--no-cache", "--quiet",
            "--no-track"]


def last(body: dict) -> str:
    return body["messages"][-1]["content"]


def finds_something(messages: list[dict]) -> str:
    """Every audit reports a missed item (so every task revises); the judge fails bullet rubrics."""
    text = messages[-1]["content"]
    if "satisfaction_status" in text:
        status = "no" if "bullet" in text.split("requirement")[-1] else "yes"
        return json.dumps({"reason": "checked", "satisfaction_status": status})
    if '- "confirmed_correct"' in text:
        return json.dumps({"confirmed_correct": [{"text": "keeps the format", "issue_type": None}],
                           "confirmed_data": [], "possibly_wrong": [],
                           "possibly_missed": [{"text": "the closing line", "issue_type": None}]})
    if "[fix_set]" in text:
        return "Revised: all requirements addressed, the closing line too. Ask your Brightwater pharmacist."
    return default_reply(messages)


@pytest.mark.parametrize("text, reasoning, answer", [
    ("<think>a {b} c</think>\n\nThe answer.", "a {b} c", "The answer."),
    ("  <THINK>x</THINK>answer", "x", "answer"),
    ("planning {x}</think>\n| a |", "planning {x}", "| a |"),  # the template opened the tag
    ("<think>cut while thinking {", "cut while thinking {", ""),
    ("Plain answer with </b> tags", "", "Plain answer with </b> tags"),
    ("Answer first. <think>aside</think> more", "", "Answer first. <think>aside</think> more"),
])
def test_split_reasoning_takes_off_leading_thoughts_only(text, reasoning, answer):
    assert split_reasoning(text) == (reasoning, answer)


def test_baseline_request_is_exactly_the_task_messages(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer() as server:
        r = cli("run", DEMO, "--method", "baseline", "--out", str(out), *remote(server, "--max-tokens", "512"))
        assert r.returncode == 0, r.stderr
        bodies = list(server.requests)
    tasks = load_tasks(DEMO).tasks
    assert sorted(json.dumps(b["messages"]) for b in bodies) == \
        sorted(json.dumps([m.model_dump() for m in t.messages]) for t in tasks)
    for body in bodies:
        assert "response_format" not in body and "max_completion_tokens" not in body
        assert body["max_tokens"] == 512
    for row in read_rows(out):  # the reply's content, as CL-bench's infer.py takes it
        assert row["model_output"].startswith("Answer ") and not row["model_output"].startswith("{")


def test_free_text_stages_ask_for_no_json_and_typed_stages_send_their_schema(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer(reply=finds_something) as server:
        r = cli("run", DEMO, "--out", str(out), *remote(server))
        assert r.returncode == 0, r.stderr
        bodies = list(server.requests)
    free = [b for b in bodies if "[request]" in last(b) or "[fix_set]" in last(b)]
    typed = [b for b in bodies if '- "confirmed_correct"' in last(b) or '- "format_ok"' in last(b)
             or '- "proc_ok"' in last(b)]
    assert len(free) == 8 and len(typed) == 6 and len(bodies) == 14  # draft + revise, audit (+ checker) per task
    for body in free:
        assert "response_format" not in body and "JSON" not in last(body).split("=====")[-1]
    for body in typed:
        assert body["response_format"]["type"] == "json_schema"
        schema = body["response_format"]["json_schema"]["schema"]
        lists = [p for p in schema["properties"].values() if p.get("type") == "array"]
        assert lists and all(p["maxItems"] == 24 for p in lists)  # the remote default item limit
    rows = read_rows(out)
    assert {r["trace"]["path"] for r in rows} <= {"revised", "rolled-back"}
    assert all(not r["model_output"].startswith("{") for r in rows)


def run_and_grade(server, tmp_path, name):
    out, graded = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.graded.jsonl"
    r = cli("run", DEMO, "--out", str(out), *remote(server))
    assert r.returncode == 0, r.stderr
    r = cli("eval", str(out), "--out", str(graded), *judge_flags(server))
    assert r.returncode == 0, r.stderr
    return {x["idx"]: x for x in read_rows(out)}, {x["idx"]: x for x in read_rows(graded)}


@pytest.mark.parametrize("reasoning", ["inline", "template", "field", "reasoning"])
def test_thinking_replies_give_the_same_answers_and_labels_as_plain_ones(tmp_path, reasoning):
    with ChatServer(reply=finds_something) as server:
        plain_rows, plain_graded = run_and_grade(server, tmp_path, "plain")
    with ChatServer(reply=finds_something, reasoning=reasoning) as server:
        rows, graded = run_and_grade(server, tmp_path, reasoning)
    assert {i: r["model_output"] for i, r in rows.items()} == {i: r["model_output"] for i, r in plain_rows.items()}
    assert {i: r["trace"]["path"] for i, r in rows.items()} == {i: r["trace"]["path"] for i, r in plain_rows.items()}
    assert {i: g["requirement_status"] for i, g in graded.items()} == \
        {i: g["requirement_status"] for i, g in plain_graded.items()}
    assert any(s == "no" for g in graded.values() for s in g["requirement_status"])  # the labels are not all alike
    for row in rows.values():
        assert "<think>" not in row["model_output"] and "</think>" not in row["model_output"]
        assert all(c["reasoning_chars"] > 0 for c in row["trace"]["cost"].values())  # kept in the trace
        assert row["trace"]["failures"] == []


def test_a_reply_cut_at_max_tokens_is_recorded_as_truncated(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer() as server:
        r = cli("run", DEMO, "--method", "baseline", "--out", str(out), *remote(server, "--max-tokens", "3"))
        assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["truncated_replies"] == 4
    for row in read_rows(out):
        assert len(row["model_output"].split()) == 3
        assert row["trace"]["cost"]["draft"]["truncated"] == 1
        assert row["trace"]["failures"] == ["draft: the reply was cut at max_tokens; what it holds is used"]


def test_llama_cpp_server_gets_json_object_after_one_rejection_and_only_max_tokens(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer(profile="llama-cpp") as server:
        r = cli("run", DEMO, "--out", str(out), *remote(server, "--threads", "4", "--max-tokens", "300"))
        assert r.returncode == 0, r.stderr
        bodies = list(server.requests)
    rejected = [b for b in bodies if (b.get("response_format") or {}).get("type") == "json_schema"]
    assert len(rejected) == 1  # negotiated once for the endpoint, never retried
    typed = [b for b in bodies if b.get("response_format")]
    assert len(typed) == 1 + 6 and all(b["response_format"]["type"] == "json_object" for b in typed[1:])
    assert all("properties" in b["response_format"]["schema"] for b in typed if b not in rejected)
    assert all(b["max_tokens"] == 300 and "max_completion_tokens" not in b for b in bodies)
    summary = json.loads(r.stdout)
    assert summary["structured_output"] == {"json_object": 6} and summary["paths"] == {"early-return": 4}


def test_structured_output_off_sends_no_response_format(tmp_path):
    with ChatServer() as server:
        r = cli("run", DEMO, "--out", str(tmp_path / "o.jsonl"), *remote(server, "--structured-output", "off"))
        assert r.returncode == 0, r.stderr
        assert server.requests and not any("response_format" in b for b in server.requests)
    assert json.loads(r.stdout)["structured_output"] == {"off": 6}


def test_a_reply_of_thoughts_only_fails_the_draft_and_keeps_the_draft_on_audit(tmp_path):
    thoughts = "<think>I should check Harbor Lane and {the rules} first, then"
    with ChatServer() as server:
        server.inject("text", text=thoughts, match="Harbor Lane", times=2)  # demo-pt-1's draft, asked twice
        server.inject("text", text="<think>all fine</think>", match='- "confirmed_correct"', times=100)
        r = cli("run", DEMO, "--out", str(tmp_path / "o.jsonl"), *remote(server))
    assert r.returncode == 1 and "failed task demo-pt-1" in r.stderr and "no answer" in r.stderr
    rows = {x["idx"]: x for x in read_rows(tmp_path / "o.jsonl")}
    assert rows["demo-pt-1"]["error"] and rows["demo-pt-1"]["model_output"] == ""
    for idx in ("demo-dk-1", "demo-ed-1", "demo-rs-1"):
        trace = rows[idx]["trace"]
        assert trace["path"] == "stage-failed" and rows[idx]["model_output"] == trace["draft"]
        assert trace["cost"]["audit"]["calls"] == 2 and "no answer" in trace["failures"][-1]


def test_the_cache_never_answers_for_another_endpoint(tmp_path):
    env = {"DSPY_CACHEDIR": str(tmp_path / "cache")}
    with ChatServer() as a, ChatServer() as b:
        def run(server, name):
            r = cli("run", DEMO, "--method", "baseline", "--out", str(tmp_path / name), "--model", "openai/same-name",
                    "--api-base", server.base_url, "--quiet", env=env)
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)

        assert run(a, "a.jsonl")["lm_calls"] == 4 and len(a.requests) == 4
        assert run(b, "b.jsonl")["lm_calls"] == 4 and len(b.requests) == 4  # not A's cached answers
        again = run(a, "a2.jsonl")
        assert again["cached_answers"] == 4 and len(a.requests) == 4  # A's own answers are cached
