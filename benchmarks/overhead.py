"""The project's own time per LM call, against a zero-latency server, one thread.

Every call of a ContextGuard run (stage formatting, parsing, plan, guard, storing the
row) is timed end to end and divided by its LM calls; bare `dspy.Predict` sends a
prompt of the same size to the same server, in turn with the runs, 25 times each.
Both include the HTTP round trip, so the ratio is what the project adds. Target:
median ratio <= 1.5 for 2K- and 20K-token conversations.

    python benchmarks/overhead.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import dspy
from _common import Timer, finish, median, remote_lm, server_process

from cg_dspy.clbench import generation
from cg_dspy.clbench.data import Task
from cg_dspy.clbench.lengths import token_length
from cg_dspy.core.cost import cost_totals
from cg_dspy.method import build_program

REPEATS = 25
WORDS = "The council minutes record that the eastern granary holds forty sacks of barley. "


def task_of(tokens: int, i: int) -> Task:
    context = WORDS * max(1, tokens // len(WORDS.split()))
    return Task.model_validate({
        "messages": [{"role": "system", "content": "Answer from the records only."},
                     {"role": "user", "content": context + f"\nHow many sacks are in the granary? ({i})"}],
        "rubrics": ["The response should say forty sacks."],
        "metadata": {"task_id": f"t{tokens}-{i}", "context_id": "c", "context_category": "Domain Knowledge Reasoning",
                     "sub_category": "Management"}})


def per_call_run(lm, program, task: Task, path: Path) -> float:
    """Seconds per LM call of one task through `run`: stages, parsing, guard, storing."""
    with Timer() as t:
        rows = generation.run(program, [task], path, lm=lm, method="contextguard", threads=1, progress=False).rows
        calls = cost_totals(c for r in rows for c in r["trace"]["cost"].values())["calls"]
    return t.seconds / calls


def per_call_bare(lm, task: Task, i: int) -> float:
    predict = dspy.Predict("context, question -> answer")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()), Timer() as t:
        predict(context=task.messages[1].content, question=f"How many sacks? ({i})")
    return t.seconds


def measure(lm, tokens: int, tmp: Path) -> tuple[float, float]:
    """Median seconds per call, run and bare taken in turn so machine noise hits both."""
    program = build_program("contextguard")
    per_call_run(lm, program, task_of(tokens, -1), tmp / f"warm-{tokens}.jsonl")  # first-use costs
    run, bare = [], []
    for i in range(REPEATS):
        task = task_of(tokens, i)
        run.append(per_call_run(lm, program, task, tmp / f"o-{tokens}-{i}.jsonl"))
        bare.append(per_call_bare(lm, task, i))
    return median(run), median(bare)


def main() -> dict:
    results, rows = {}, []
    with server_process(0.0) as url, tempfile.TemporaryDirectory() as tmp:
        lm = remote_lm(url)
        per_call_bare(lm, task_of(500, -1), -1)  # warm up imports and connections
        for tokens in (2_000, 20_000):
            measured = token_length(task_of(tokens, 0).messages)
            run, bare = measure(lm, tokens, Path(tmp))
            results[tokens] = {"conversation_tokens": measured, "run_s_per_call": run, "bare_s_per_call": bare,
                               "ratio": run / bare}
            rows.append([tokens, measured, run * 1000, bare * 1000, run / bare])
    targets = {f"overhead_le_1.5x_at_{t}": results[t]["ratio"] <= 1.5 for t in results}
    return finish("overhead", ["target tokens", "tokens", "run ms/call", "bare ms/call", "ratio"], rows, targets,
                  {"repeats": REPEATS, "sizes": results})


if __name__ == "__main__":
    main()
