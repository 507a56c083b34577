"""What a prefix-caching server prefills for each method, in both layouts.

On long contexts (CL-bench averages 10.4K tokens, up to 65K) an LM's cost is prefill.
The project's test server accounts like vLLM's automatic prefix caching: a request
pays only for what follows its longest common prefix with an earlier prompt or
generation (a reply is cached as its prompt's continuation). Each method runs on the 8
real CL-bench rows of `../shared/clbench/tasks_sample.jsonl` against a fresh server
that answers free-text stages at length (~3,000 characters) and whose every audit
finds one missed item, so ContextGuard always revises (in edit mode, with one edit that
appends a ~200-character closing line). Printed per method: prompt, uncached-prefill and
completion characters as ratios to the baseline's. Targets, chat layout: ContextGuard's
uncached prefill <= 1.2x the baseline's (1.15x is the aim), Self-Refine <= 1.1x;
ContextGuard in edit mode: completion <= 1.3x the baseline's, uncached prefill <= 1.2x.

The embedded llama.cpp engine keeps the longest common prefix of its last context, the
same way: ContextGuard on the demo tasks reports, per stage, the prompt tokens it held
(`cached_prompt_tokens`), so the tokens it evaluated are shown for both layouts; and
edit mode runs there too, to count how often the small model's edits parse and apply.

    python benchmarks/prefill.py
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from _common import ROOT, finish

from cg_dspy.clbench import generation
from cg_dspy.clbench.data import load_tasks
from cg_dspy.lms import LMSettings, build_lm
from cg_dspy.method import LAYOUTS, build_program
from cg_dspy.testing.server import ChatServer, default_reply

SAMPLE = ROOT.parent / "shared" / "clbench" / "tasks_sample.jsonl"
METHODS = ("baseline", "self-refine", "contextguard", "contextguard-edit")
WORDS = ("the council record shows each requirement is addressed with its evidence and the steps in order "
         "so that the reader can check every value against the context ").split()


def prose(seed: str, chars: int) -> str:
    """Deterministic text of about `chars` characters."""
    digest = hashlib.sha256(seed.encode()).hexdigest()
    words, n = [], 0
    while n < chars:
        word = WORDS[int(digest[len(words) % 60: len(words) % 60 + 4], 16) % len(WORDS)]
        words.append(word)
        n += len(word) + 1
    return f"Answer {digest[:8]}: " + " ".join(words)


def reply(messages: list[dict]) -> str:
    last = messages[-1]["content"]
    seed = json.dumps(messages)[-4000:]
    if '- "confirmed_correct"' in last:
        return json.dumps({"confirmed_correct": [{"text": "keeps the required sections", "issue_type": None}],
                           "confirmed_data": [], "possibly_wrong": [],
                           "possibly_missed": [{"text": "the closing summary line", "issue_type": None}]})
    if '- "edits"' in last:
        return json.dumps({"edits": [{"fix_item": 1, "action": "append", "text": prose(seed, 200)}]})
    if "actionable feedback" in last:
        return prose(seed, 600)  # Self-Refine's feedback
    if '- "' in last:
        return default_reply(messages)  # checkers: their JSON keys
    return prose(seed, 3000)  # draft, revision, refinement


def measure(method: str, layout: str, tasks, tmp: Path) -> dict:
    with ChatServer(reply=reply, prefix_cache=True) as server:
        lm = build_lm(LMSettings(model="openai/bench-model", api_base=server.base_url, cache=False))
        result = generation.run(build_program(method, layout=layout), tasks, tmp / f"{method}-{layout}.jsonl", lm=lm,
                             method=method, threads=4, progress=False)
        assert not result.outcome.failed, result.outcome.failed
        entries = server.cache.requests
    totals = {key: sum(e[key] for e in entries) for key in ("prompt_chars", "uncached_chars", "completion_chars")}
    return {**totals, "requests": len(entries), "paths": result.summary["paths"]}


def embedded(tmp: Path) -> dict:
    """Prompt tokens the embedded engine evaluated (not reused from its context), per layout."""
    from cg_dspy.lms import find_local_gguf

    try:
        find_local_gguf()
    except RuntimeError:
        return {}
    tasks = load_tasks(ROOT / "data" / "demo.jsonl").tasks
    out = {}
    for layout in LAYOUTS:
        lm = build_lm(LMSettings(max_tokens=128, cache=False))
        result = generation.run(build_program("contextguard", layout=layout), tasks, tmp / f"embedded-{layout}.jsonl",
                             lm=lm, method="contextguard", threads=1, progress=False)
        costs = [c for r in result.rows for c in r["trace"]["cost"].values()]
        prompt, held = sum(c["prompt_tokens"] for c in costs), sum(c["cached_prompt_tokens"] for c in costs)
        out[layout] = {"prompt_tokens": prompt, "evaluated_tokens": prompt - held, "calls": len(costs)}
    lm = build_lm(LMSettings(max_tokens=256, cache=False))
    result = generation.run(build_program("contextguard-edit"), tasks, tmp / "embedded-edit.jsonl", lm=lm,
                            method="contextguard-edit", threads=1, progress=False)
    edits = [r["trace"].get("edits") for r in result.rows if r["trace"].get("edits")]
    out["edit"] = {"tasks": len(result.rows), "paths": result.summary["paths"], "edit_lists": len(edits),
                   "edits_given": sum(len(e["edits"]) for e in edits),
                   "edits_applied": sum(len(e["applied"]) for e in edits),
                   "edit_failures": [f for r in result.rows for f in r["trace"]["failures"] if f.startswith("edit")]}
    return out


def main() -> dict:
    if not SAMPLE.exists():
        sys.exit(f"{SAMPLE} is not here: this benchmark measures the real CL-bench rows (see shared/clbench)")
    tasks = load_tasks(SAMPLE).tasks
    results, rows = {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for layout in LAYOUTS:
            for method in METHODS:
                results[f"{method}/{layout}"] = measure(method, layout, tasks, Path(tmp))
        local = embedded(Path(tmp))
    for key, r in results.items():
        base = results[f"baseline/{key.split('/')[1]}"]
        r.update({f"{k}_ratio": r[k] / base[k] for k in ("prompt_chars", "uncached_chars", "completion_chars")})
        rows.append([key, r["requests"], r["prompt_chars"], r["prompt_chars_ratio"], r["uncached_chars"],
                     r["uncached_chars_ratio"], r["completion_chars_ratio"]])
    targets = {
        "chat_contextguard_uncached_le_1.2x_baseline": results["contextguard/chat"]["uncached_chars_ratio"] <= 1.2,
        "chat_self_refine_uncached_le_1.1x_baseline": results["self-refine/chat"]["uncached_chars_ratio"] <= 1.1,
        "chat_edit_completion_le_1.3x_baseline": results["contextguard-edit/chat"]["completion_chars_ratio"] <= 1.3,
        "chat_edit_uncached_le_1.2x_baseline": results["contextguard-edit/chat"]["uncached_chars_ratio"] <= 1.2,
    }
    aim = results["contextguard/chat"]["uncached_chars_ratio"] <= 1.15
    print(f"aim, ContextGuard chat uncached <= 1.15x: {'reached' if aim else 'not reached'}")
    for layout in LAYOUTS:
        if layout in local:
            r = local[layout]
            print(f"embedded llama.cpp, ContextGuard on the demo tasks, {layout}: {r['evaluated_tokens']} of "
                  f"{r['prompt_tokens']} prompt tokens evaluated")
    if "edit" in local:
        e = local["edit"]
        print(f"embedded llama.cpp, edit mode on the demo tasks: paths {e['paths']}; {e['edit_lists']} edit lists "
              f"parsed, {e['edits_applied']} of {e['edits_given']} edits applied; stage failures: "
              f"{e['edit_failures'] or 'none'}")
    if local:
        ratio = local["chat"]["evaluated_tokens"] / local["inline"]["evaluated_tokens"]
        print(f"evaluated, chat / inline: {ratio:.2f}")
    print()
    return finish("prefill", ["method/layout", "requests", "prompt chars", "x baseline", "uncached chars",
                              "x baseline", "completion x baseline"], rows, targets,
                  {"tasks": len(tasks), "methods": results, "aim_1.15_reached": aim, "embedded": local})


if __name__ == "__main__":
    main()
