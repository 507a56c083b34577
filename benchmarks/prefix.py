"""Prefix sharing: how much of each stage's prompt repeats the draft's byte for byte.

Servers with prefix caching (vLLM, SGLang, OpenAI, llama.cpp) reuse the KV cache of a
shared leading part. For every stage of ContextGuard and Self-Refine on every data
task, in both layouts, the serialized messages are compared with the draft's: the
draft prompt, and in the chat layout the draft prompt followed by the draft as the
assistant's turn. Reported: the share of that part each stage prompt starts with.
Targets: chat layout 1.00 for every stage (a stage prefills only its own turn);
inline layout >= 0.9 of the conversation (the stage text follows the task's last
message, so the draft itself is prefilled again).

    python benchmarks/prefix.py
"""

from __future__ import annotations

import sys

from _common import ROOT, finish

sys.path.insert(0, str(ROOT / "tests"))
from scripted import scripted_lm  # noqa: E402
from test_program import DRAFT, script  # noqa: E402

from cg_dspy.clbench.data import load_tasks  # noqa: E402
from cg_dspy.lms import using  # noqa: E402
from cg_dspy.method import LAYOUTS, build_program  # noqa: E402
from cg_dspy.testing.server import common_prefix, serialized  # noqa: E402


def main() -> dict:
    tasks = load_tasks(ROOT / "data" / "tasks.jsonl").tasks
    shares: dict[str, list[float]] = {}
    for layout in LAYOUTS:
        for method in ("contextguard", "self-refine"):
            for task in tasks:
                lm, engine = scripted_lm(script())
                with using(lm):
                    build_program(method, layout=layout)(conversation=task.messages, category=task.category)
                draft_prompt = engine.calls[0].messages
                if layout == "chat":  # what every later stage should start with, whole
                    reused = serialized([*draft_prompt, {"role": "assistant", "content": DRAFT}])[:-len(
                        "<|assistant|>\n")]
                else:  # the conversation, up to where the stage text is appended
                    reused = serialized([m.model_dump() for m in task.messages])[:-len("<|end|>\n<|assistant|>\n")]
                for call in engine.calls[1:]:
                    shared = common_prefix(reused, serialized(call.messages))
                    shares.setdefault(f"{layout}:{method}:{call.stage}", []).append(shared / len(reused))
    rows = [[stage, len(v), min(v), sum(v) / len(v)] for stage, v in shares.items()]
    targets = {
        "chat_every_stage_shares_the_whole_draft_chat": all(min(v) == 1.0 for k, v in shares.items()
                                                            if k.startswith("chat:")),
        "inline_every_stage_shares_ge_0.9_of_the_conversation": all(min(v) >= 0.9 for k, v in shares.items()
                                                                    if k.startswith("inline:")),
    }
    return finish("prefix", ["layout:method:stage", "prompts", "min shared fraction", "mean"], rows, targets,
                  {"stages": {k: {"prompts": len(v), "min": min(v), "mean": sum(v) / len(v)}
                              for k, v in shares.items()}})


if __name__ == "__main__":
    main()
