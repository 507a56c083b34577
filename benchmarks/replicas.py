"""Several replicas: throughput, pinning and a replica killed mid-run.

Test-server part (about a minute): 52 tasks (the 13 of data/tasks.jsonl, four copies
each), ContextGuard, 8 threads, every server single-slot (one request at a time, like a
llama.cpp server without --parallel) answering after 50 ms. One replica against four
(`--api-base` four times): the throughput ratio (target >= 3.2x); the share of each
task's calls that reached its pinned replica (target 100%); and with one of the four
killed after 15 requests (its open connections cut), the tasks lost (target 0).

`--real` adds real parts: two `python -m llama_cpp.server` processes on the bundled
GGUF, the demo run over both with one killed mid-run (every task must finish), and the
demo through a LiteLLM proxy (`litellm --config`, its own router) in front of two
servers (every task must finish). The proxy needs LiteLLM's proxy extras (`pip install
'litellm[proxy]'`); without them that run is reported as skipped. (Here the package index
has no `litellm-proxy`, the extra's own package, so its dependencies were installed one
by one: websockets, backoff, redis, apscheduler, PyJWT, semver, python-multipart,
expression, fastapi_sso, mcp, soundfile, uvloop.)

    python benchmarks/replicas.py [--real]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, Timer, finish

from cg_dspy.clbench import generation
from cg_dspy.clbench.data import Task, load_tasks
from cg_dspy.lms import LMSettings, build_lm
from cg_dspy.method import build_program
from cg_dspy.testing import llama
from cg_dspy.testing.server import ChatServer

COPIES, THREADS, LATENCY = 4, 8, 0.05
PROXY_KEY = "sk-local-benchmark"  # the proxy's own key on loopback, sent as OPENAI_API_KEY; not a secret


def tasks() -> list[Task]:
    """Four distinct copies of each task (the copy marked in its first message)."""
    out = []
    for copy in range(COPIES):
        for task in load_tasks(ROOT / "data" / "tasks.jsonl").tasks:
            row = task.model_dump()
            row["metadata"]["task_id"] = f"{task.idx}-c{copy}"
            first = next(m for m in row["messages"] if m["role"] == "user")
            first["content"] = f"[copy {copy}] {first['content']}"
            out.append(Task.model_validate(row))
    return out


def marker(body: dict) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")[:80]


def run(servers: list[ChatServer], todo: list[Task], out: Path) -> dict:
    lm = build_lm(LMSettings(model="openai/bench-model", api_base=",".join(s.base_url for s in servers), cache=False))
    with Timer() as t:
        result = generation.run(build_program("contextguard"), todo, out, lm=lm, method="contextguard",
                                threads=THREADS, progress=False)
    calls = sum(len(s.requests) for s in servers)
    where: dict[str, list[int]] = {}
    for i, server in enumerate(servers):
        for body in server.requests:
            where.setdefault(marker(body), []).append(i)
    pinned = sum(max(map(where[k].count, set(where[k]))) for k in where) / calls
    return {"seconds": t.seconds, "calls": calls, "calls_per_s": calls / t.seconds, "finished": result.summary[
        "finished"], "failed": result.summary["failed"], "pinned_share": pinned,
        "endpoints": result.summary.get("endpoints")}


def test_server_part(tmp: Path) -> tuple[dict, list, dict]:
    todo = tasks()
    results = {}
    for name, n, kill in (("1 replica", 1, None), ("4 replicas", 4, None), ("4 replicas, 1 killed", 4, 15)):
        servers = [ChatServer(latency=LATENCY, slots=1, die_after=kill if i == 0 else None) for i in range(n)]
        for s in servers:
            s.__enter__()
        try:
            results[name] = run(servers, todo, tmp / f"{n}-{kill}.jsonl")
        finally:
            for s in servers:
                s.__exit__(None, None, None)
    ratio = results["4 replicas"]["calls_per_s"] / results["1 replica"]["calls_per_s"]
    rows = [[k, r["seconds"], r["calls"], r["calls_per_s"], f"{r['finished']}/{len(todo)}", r["pinned_share"]]
            for k, r in results.items()]
    killed = results["4 replicas, 1 killed"]
    targets = {"throughput_4_over_1_ge_3.2x": ratio >= 3.2,
               "pinned_share_100pct": results["4 replicas"]["pinned_share"] == 1.0,
               "tasks_lost_when_one_killed_0": killed["finished"] == len(todo) and killed["failed"] == 0
               and next(iter(killed["endpoints"].values()))["failures"] > 0}
    print(f"throughput, 4 replicas / 1: {ratio:.2f}x")
    print(f"one killed: {json.dumps(killed['endpoints'])}")
    return results, rows, {"ratio": ratio, "targets": targets}


def llama_server() -> tuple[str, subprocess.Popen]:
    return llama.start_server("--n_threads", "1")


def demo(out: Path, *bases: str, kill: subprocess.Popen | None = None, after: float = 0.0, env: dict | None = None
         ) -> dict:
    flags = [x for b in bases for x in ("--api-base", b)]
    cmd = [sys.executable, "-m", "cg_dspy.cli", "run", str(ROOT / "data" / "demo.jsonl"), "--out", str(out),
           "--model", "openai/smollm", *flags, "--max-tokens", "256", "--no-cache", "--quiet", "--no-track",
           "--threads", "4"]
    with Timer() as t:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        if kill is not None:
            time.sleep(after)
            kill.kill()
        stdout, stderr = proc.communicate()
    if proc.returncode not in (0, 1):
        raise RuntimeError(stderr[-2000:])
    return {**json.loads(stdout), "wall_s": t.seconds}


def proxy(bases: list[str], tmp: Path) -> tuple[str, subprocess.Popen] | None:
    try:
        import litellm.proxy.proxy_server  # noqa: F401
    except ImportError as exc:
        print(f"LiteLLM proxy skipped: {exc}")
        return None
    config = tmp / "litellm.yaml"
    config.write_text("model_list:\n" + "".join(
        f"  - model_name: smollm\n    litellm_params:\n      model: openai/smollm\n      api_base: {b}\n"
        "      api_key: none\n" for b in bases) + "router_settings:\n  routing_strategy: simple-shuffle\n"
        f"general_settings:\n  master_key: {PROXY_KEY}\n")
    port = llama.free_port()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "litellm"), "--config", str(config), "--host",
                             "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    llama.wait_up(url, proc, "the LiteLLM proxy")
    return url, proc


def real_part(tmp: Path) -> tuple[dict, list, dict]:
    results: dict = {}
    procs: list[subprocess.Popen] = []
    try:
        (a, pa), (b, pb) = llama_server(), llama_server()
        procs += [pa, pb]
        results["2 llama servers, one killed at 20 s"] = demo(tmp / "two.jsonl", a, b, kill=pa, after=20.0)
        c, pc = llama_server()
        procs.append(pc)
        front = proxy([b, c], tmp)
        if front:
            procs.append(front[1])
            results["LiteLLM proxy over 2 llama servers"] = demo(tmp / "proxy.jsonl", front[0],
                                                                 env={"OPENAI_API_KEY": PROXY_KEY})
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)
    rows = [[k, r["wall_s"], f"{r['finished']}/{r['tasks']}", json.dumps(r.get("endpoints") or {})[:90]]
            for k, r in results.items()]
    targets = {f"{k}: every demo task finishes": r["finished"] == r["tasks"] == 4 for k, r in results.items()}
    return results, rows, {"targets": targets}


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        results, rows, extra = test_server_part(Path(tmp))
        targets = dict(extra["targets"])
        payload = {"test_server": results, "ratio": extra["ratio"]}
        if "--real" in sys.argv:
            real, real_rows, real_extra = real_part(Path(tmp))
            payload["real"] = real
            targets.update(real_extra["targets"])
            rows += [[name, wall, done, "", "", ""] for name, wall, done, _ in real_rows]
    return finish("replicas", ["run", "seconds", "calls", "calls/s", "finished", "pinned share"], rows, targets,
                  payload)


if __name__ == "__main__":
    main()
