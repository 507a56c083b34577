"""Prefix sharing: how much of each stage's prompt repeats the draft prompt byte for byte.

Servers with prefix caching (vLLM, OpenAI, llama.cpp) reuse the KV cache of a shared
leading part. For every stage of ContextGuard (and the baselines' stages) on every data
task, the serialized messages are compared with the draft prompt's; the shared
leading bytes are divided by the bytes of the conversation part. Target: >= 0.9.

    python benchmarks/prefix.py
"""

from __future__ import annotations

import os
import sys

from _common import ROOT, finish

sys.path.insert(0, str(ROOT / "tests"))
from scripted import scripted_lm  # noqa: E402
from test_program import script  # noqa: E402

from cg_dspy.evaluation.data import load_tasks  # noqa: E402
from cg_dspy.lms import using
from cg_dspy.method import build_program


def serialized(messages: list[dict]) -> str:
    return "".join(f"<|{m['role']}|>{m['content']}" for m in messages)


def main() -> dict:
    tasks = load_tasks(ROOT / "data" / "tasks.jsonl").tasks
    shares: dict[str, list[float]] = {}
    for method in ("contextguard", "self-refine"):
        for task in tasks:
            lm, engine = scripted_lm(script())
            with using(lm):
                build_program(method)(conversation=task.messages, category=task.category)
            conversation = serialized([m.model_dump() for m in task.messages])
            first = serialized(engine.calls[0].messages)
            for call in engine.calls[1:]:
                prompt = serialized(call.messages)
                shared = len(os.path.commonprefix([first, prompt]))
                shares.setdefault(f"{method}:{call.stage}", []).append(min(1.0, shared / len(conversation)))
    rows = [[stage, len(v), min(v), sum(v) / len(v)] for stage, v in shares.items()]
    ok = all(min(v) >= 0.9 for v in shares.values())
    return finish("prefix", ["stage", "prompts", "min shared fraction", "mean"], rows, {"prefix_share_ge_0.9": ok},
                  {"stages": {k: {"prompts": len(v), "min": min(v), "mean": sum(v) / len(v)}
                              for k, v in shares.items()}})

if __name__ == "__main__":
    main()
