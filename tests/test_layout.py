"""The chat layout: every stage continues the draft's chat, so a prefix-caching server
prefills only the stage's own turn; the inline layout stays selectable."""

import json

import pytest
from conftest import DATA, cli

from cg_dspy.clbench.store import read_rows
from cg_dspy.testing.server import ChatServer, PrefixCache, default_reply, serialized


def test_prefix_cache_accounting_counts_only_what_follows_the_longest_cached_prefix():
    cache = PrefixCache()
    first = serialized([{"role": "user", "content": "abc"}])
    assert cache.record(first, "XY") == {"prompt_chars": len(first), "uncached_chars": len(first),
                                         "completion_chars": 2}
    follow = serialized([{"role": "user", "content": "abc"}, {"role": "assistant", "content": "XY"},
                         {"role": "user", "content": "go"}])
    cached = len(first) + len("XY<|end|>\n")  # the reply is cached as its prompt's continuation
    assert follow.startswith(first + "XY<|end|>\n")
    assert cache.record(follow, "Z")["uncached_chars"] == len(follow) - cached
    other = serialized([{"role": "user", "content": "abd"}])
    assert cache.record(other, "")["uncached_chars"] == len(other) - len("<|user|>\nab")


def finds_something(messages):
    if '- "confirmed_correct"' in messages[-1]["content"]:
        return json.dumps({"confirmed_correct": [], "confirmed_data": [], "possibly_wrong": [],
                           "possibly_missed": [{"text": "the closing line", "issue_type": None}]})
    if "actionable feedback" in messages[-1]["content"]:
        return "Add the closing line."
    if "[fix_set]" in messages[-1]["content"]:
        return "Revised answer, the closing line added: Ask your Brightwater pharmacist. " * 20
    return default_reply(messages) if '- "' in messages[-1]["content"] else "A long first draft. " * 40


@pytest.mark.parametrize("method", ["contextguard", "self-refine"])
def test_chat_layout_prefills_less_than_inline_and_reports_the_cached_tokens(tmp_path, method):
    uncached, cached_tokens = {}, {}
    for layout in ("inline", "chat"):
        out = tmp_path / f"{layout}.jsonl"
        with ChatServer(reply=finds_something, prefix_cache=True) as server:
            r = cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--method", method, "--layout", layout,
                    "--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet",
                    "--no-track")
            assert r.returncode == 0, r.stderr
            uncached[layout] = sum(e["uncached_chars"] for e in server.cache.requests)
            bodies = list(server.requests)
        cached_tokens[layout] = json.loads(r.stdout)["cached_prompt_tokens"]
        later = [b for b in bodies if "[request]" not in b["messages"][-1]["content"] and len(b["messages"]) > 2
                 and b["messages"][-2]["role"] == "assistant"]
        if layout == "chat":  # every stage after the draft continues its chat
            assert len(later) == len(bodies) - 4
            rows = {x["idx"]: x for x in read_rows(out)}
            for body in later:
                draft = body["messages"][-2]["content"]
                assert draft in {x["trace"]["draft"] for x in rows.values()}
                assert draft not in body["messages"][-1]["content"]
        else:
            assert later == [] or all(b["messages"][-2]["content"] != "A long first draft. " * 40 for b in later)
    assert uncached["chat"] < uncached["inline"]
    assert cached_tokens["chat"] > cached_tokens["inline"] > 0  # the server's cached_tokens reach the summary


def test_a_rerun_in_the_other_layout_is_a_different_run(tmp_path):
    out = tmp_path / "o.jsonl"
    with ChatServer() as server:
        flags = ["--model", "openai/test-model", "--api-base", server.base_url, "--no-cache", "--quiet", "--no-track"]
        assert cli("run", str(DATA / "demo.jsonl"), "--out", str(out), *flags).returncode == 0
        r = cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--layout", "inline", *flags)
    assert r.returncode == 2 and 'config.layout: "chat" -> "inline"' in r.stderr
