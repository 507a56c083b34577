"""LM calls and tokens per task for every method, against the local server.

The server answers every stage validly; half of the audits (by a stable hash of the
prompt) report a missed item, so ContextGuard takes both the revision path and the
early-return path. Targets: ContextGuard makes at most 4 calls on a task it revises
and at most 3 on an early return.

    python benchmarks/cost.py
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

from _common import ROOT, finish

from cg_dspy.clbench import generation
from cg_dspy.clbench.data import load_tasks
from cg_dspy.core.cost import cost_totals
from cg_dspy.lms import LMSettings, build_lm
from cg_dspy.method import build_program, method_names
from cg_dspy.testing.server import ChatServer, default_reply


def reply(messages: list[dict]) -> str:
    text = messages[-1]["content"]
    if '- "confirmed_correct"' in text and int(hashlib.sha256(text.encode()).hexdigest(), 16) % 2 == 0:
        return json.dumps({"confirmed_correct": [{"text": "keeps the format", "issue_type": None}],
                           "confirmed_data": [], "possibly_missed": [{"text": "a missed rule", "issue_type": None}],
                           "possibly_wrong": []})
    if "[fix_set]" in text:
        return "Answer revised: all requirements addressed, the missed rule too."
    return default_reply(messages)


def main() -> dict:
    tasks = load_tasks(ROOT / "data" / "tasks.jsonl").tasks + load_tasks(ROOT / "data" / "demo.jsonl").tasks
    results, rows = {}, []
    with ChatServer(reply=reply) as server, tempfile.TemporaryDirectory() as tmp:
        lm = build_lm(LMSettings(model="openai/bench-model", api_base=server.base_url, cache=False))
        for method in method_names():
            out = generation.run(build_program(method), tasks, Path(tmp) / f"{method}.jsonl", lm=lm, method=method,
                              threads=8, progress=False).rows
            totals = [cost_totals(r["trace"]["cost"].values()) for r in out]
            calls = [t["calls"] for t in totals]
            tokens = [t["prompt_tokens"] + t["completion_tokens"] for t in totals]
            paths = [r["trace"].get("path") for r in out]
            results[method] = {
                "tasks": len(out),
                "calls_per_task": sum(calls) / len(out),
                "tokens_per_task": sum(tokens) / len(out),
                "early_return_share": paths.count("early-return") / len(out),
                "max_calls_revised": max((c for c, p in zip(calls, paths) if p in ("revised", "rolled-back")),
                                         default=0),
                "max_calls_early_return": max((c for c, p in zip(calls, paths) if p == "early-return"), default=0),
            }
    base = results["baseline"]
    for method, r in results.items():
        r["calls_ratio_to_baseline"] = r["calls_per_task"] / base["calls_per_task"]
        r["tokens_ratio_to_baseline"] = r["tokens_per_task"] / base["tokens_per_task"]
        rows.append([method, r["calls_per_task"], r["calls_ratio_to_baseline"], r["tokens_per_task"],
                     r["tokens_ratio_to_baseline"], r["early_return_share"]])
    cg = results["contextguard"]
    targets = {
        "contextguard_calls_when_revised_le_4": cg["max_calls_revised"] <= 4,
        "contextguard_calls_on_early_return_le_3": cg["max_calls_early_return"] <= 3,
    }
    print(f"ContextGuard calls at most: {cg['max_calls_revised']} on a revised task, "
          f"{cg['max_calls_early_return']} on an early return\n")
    return finish("cost", ["method", "calls/task", "x baseline", "tokens/task", "x baseline", "early-return share"],
                  rows, targets, {"methods": results})

if __name__ == "__main__":
    main()
