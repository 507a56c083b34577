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

from cg_dspy.evaluation.store import read_rows

MAX_TOKENS = 256


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
                             "--host", "127.0.0.1", "--port", str(port)],
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


def test_demo_runs_through_llama_cpp_server_with_full_paths_and_the_token_limit(llama_server, tmp_path):
    out = tmp_path / "o.jsonl"
    r = cli("run", str(DATA / "demo.jsonl"), "--out", str(out), "--model", "openai/smollm", "--api-base",
            llama_server, "--max-tokens", str(MAX_TOKENS), "--no-cache", "--quiet", timeout=900)
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
