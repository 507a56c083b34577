"""`contextguard compare`: each tuned stage's prompt versions side by side with their dev
scores, a unified diff of instructions and demos between two versions, and a compact
table per run kind. Demos are read through `prompts.demos_of`, like any registry data."""

from __future__ import annotations

import difflib
import json

from cg_dspy.tracking import prompts
from cg_dspy.tracking.store import KIND_TAG, mlflow

RUN_COLUMNS = {
    "optimize": ["params.optimizer", "params.budget", "dev_before.task_solving_rate", "dev.task_solving_rate",
                 "dev_before.rubric_pass_rate", "dev.rubric_pass_rate"],
    "eval": ["params.protocol", "params.votes", "task_solving_rate"],
    "run": ["params.method", "finished", "failed", "lm_calls"],
}


def _demos_text(version, stage: str) -> list[str]:
    demos = prompts.demos_of(version, stage, "compare")
    return json.dumps(demos, indent=1, ensure_ascii=False, sort_keys=True, default=str).splitlines()


def compare(experiment: str, *, stages: list[str] | None = None, a: int | None = None, b: int | None = None) -> dict:
    """The versions of each tuned stage with their dev scores, a unified diff of
    instructions and demos between two versions (default: the base and the best by dev
    task-solving rate), and a compact metric table per run kind."""
    stages_out = {}
    for prompt in prompts.registered():
        stage = prompt.name.removeprefix(f"{prompts.PROMPT_PREFIX}.")
        versions = prompts.versions(prompt.name)
        if (stages and stage not in stages) or (not stages and len(versions) < 2):
            continue
        rows = [prompts.version_row(v) for v in versions]
        best = max(rows, key=lambda r: (r["dev_after"] if r["dev_after"] is not None else -1, r["version"]))
        va, vb = (a or rows[0]["version"]), (b or best["version"])
        pick = {int(v.version): v for v in versions}
        if va not in pick or vb not in pick:
            raise ValueError(f"{prompt.name}: versions are {sorted(pick)}; --a {va} / --b {vb} is not one of them")
        diff = difflib.unified_diff(pick[va].template.splitlines(), pick[vb].template.splitlines(), f"v{va}",
                                    f"v{vb}", lineterm="")
        demos = difflib.unified_diff(_demos_text(pick[va], stage), _demos_text(pick[vb], stage), f"v{va} demos",
                                     f"v{vb} demos", lineterm="")
        stages_out[stage] = {"versions": rows, "a": va, "b": vb, "instructions_diff": "\n".join(diff),
                             "demos_diff": "\n".join(demos)}
    runs = mlflow().search_runs(experiment_names=[experiment], output_format="list", order_by=["start_time ASC"])
    tables: dict[str, list[dict]] = {}
    for r in runs:
        kind = r.data.tags.get(KIND_TAG)
        if kind is None:
            continue
        cells = {"run_id": r.info.run_id[:8], "name": r.info.run_name}
        for column in RUN_COLUMNS.get(kind, ["task_solving_rate"]):
            key = column.removeprefix("params.")
            cells[key] = r.data.params.get(key) if column.startswith("params.") else r.data.metrics.get(column)
        tables.setdefault(kind, []).append(cells)
    return {"stages": stages_out, "runs": tables}
