"""`contextguard bench`: several methods run and judged on the same tasks, paired.

Pairing follows the paper: Self-Refine and ContextGuard without the reminder revise
the baseline's own draft; ContextGuard's other ablations revise the full method's
reminder draft. Everything lands in one folder: `<method>.jsonl`,
`<method>.graded.jsonl`, `report.json`, `report.md`.
"""

from __future__ import annotations

import json
from pathlib import Path

from cg_dspy import analysis, harness, judge
from cg_dspy.store import ResultStore


def draft_source(method: str) -> str | None:
    """Which method's drafts a method revises, for paired comparisons."""
    if method in ("self-refine", "contextguard-no-reminder"):
        return "baseline"
    if method.startswith("contextguard-no-"):
        return "contextguard"
    return None


def ordered(methods: list[str]) -> list[str]:
    """Methods whose drafts others reuse run first; needed sources are added."""
    wanted = list(dict.fromkeys(methods))
    for m in list(wanted):
        src = draft_source(m)
        if src and src not in wanted:
            wanted.insert(0, src)
    return sorted(wanted, key=lambda m: (m != "baseline", m != "contextguard"))


def run_bench(tasks, methods, out_dir: Path, *, lm, judge_lm, votes=3, protocol="rubric", threads=4,
              progress=True) -> int:
    """Run, judge and report every method; returns the CLI exit status."""
    out_dir.mkdir(parents=True, exist_ok=True)
    answers: dict[str, dict[str, str]] = {}
    graded_runs: dict[str, list[dict]] = {}
    failed = False
    for method in ordered(methods):
        src = draft_source(method)
        with ResultStore(out_dir / f"{method}.jsonl") as store:
            outcome = harness.run(harness.build_program(method), tasks, store, lm=lm, method=method,
                                  threads=threads, drafts=answers.get(src), progress=progress)
            rows = list(store.rows.values())
        failed |= bool(outcome.failed)
        if outcome.interrupted:
            return 130
        answers[method] = {r["idx"]: r.get("trace", {}).get("draft") or r["model_output"] for r in rows}
        goutcome, graded = judge.grade_file(rows + [r for r in outcome.rows if r.get("error")],
                                            str(out_dir / f"{method}.graded.jsonl"), judge_lm=judge_lm,
                                            protocol=protocol, votes=votes, threads=threads, progress=progress)
        failed |= bool(goutcome.failed)
        graded_runs[method] = graded
    result = analysis.report(graded_runs)
    base = "baseline" if "baseline" in graded_runs else None
    if base:
        result["comparisons"] = {f"{base} -> {m}": analysis.compare(graded_runs[base], g)
                                 for m, g in graded_runs.items() if m != base}
    (out_dir / "report.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (out_dir / "report.md").write_text(analysis.to_markdown(result), encoding="utf-8")
    print(analysis.to_markdown(result))
    return 1 if failed else 0
