"""The demo through a real OpenAI-compatible server versus in-process, same model.

llama-cpp-python's own server (`python -m llama_cpp.server`) on the bundled SmolLM2
GGUF, reached as a user would (`--model openai/smollm --api-base ...`), against the
embedded llama.cpp engine on the same file, both with `--max-tokens 256` and the
DSPy cache off. Target: the server run takes at most 2x the in-process wall time;
every task finishes and at least 3 of 4 take a full ContextGuard path.

    python benchmarks/real_server.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, Timer, finish

from cg_dspy.testing import llama

MAX_TOKENS = "256"
FULL_PATHS = ("revised", "rolled-back", "early-return")


def run(out: Path, *flags: str) -> dict:
    cmd = [sys.executable, "-m", "cg_dspy.cli", "run", str(ROOT / "data" / "demo.jsonl"), "--out", str(out),
           "--max-tokens", MAX_TOKENS, "--no-cache", "--quiet", *flags]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main() -> dict:
    results, rows = {}, []
    url, server = llama.start_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            with Timer() as t:
                results["in-process"] = run(Path(tmp) / "local.jsonl")
            results["in-process"]["wall_s"] = t.seconds
            with Timer() as t:
                results["llama_cpp.server"] = run(Path(tmp) / "server.jsonl", "--model", "openai/smollm",
                                                  "--api-base", url)
            results["llama_cpp.server"]["wall_s"] = t.seconds
    finally:
        server.terminate()
        server.wait(timeout=30)
    for name, r in results.items():
        full = sum(r["paths"].get(p, 0) for p in FULL_PATHS)
        rows.append([name, r["wall_s"], r["lm_calls"], r["completion_tokens"], r["truncated_replies"],
                     f"{r['finished']}/{r['tasks']}", full, json.dumps(r["paths"])])
    ratio = results["llama_cpp.server"]["wall_s"] / results["in-process"]["wall_s"]
    print(f"server / in-process wall time: {ratio:.2f}\n")
    srv = results["llama_cpp.server"]
    targets = {"server_wall_le_2x_in_process": ratio <= 2.0,
               "server_all_tasks_finish": srv["finished"] == srv["tasks"] == 4,
               "server_ge_3_full_paths": sum(srv["paths"].get(p, 0) for p in FULL_PATHS) >= 3}
    return finish("real_server", ["run", "wall s", "LM calls", "completion tokens", "truncated", "finished",
                                  "full paths", "paths"], rows, targets, {"ratio": ratio, "runs": results})


if __name__ == "__main__":
    main()
