"""`contextguard compare` as data: each tuned stage's prompt versions side by side with their
dev scores (and each version's paired difference from the untuned program), a unified
diff of instructions and demos between two versions, and a compact table per run kind.
Pure: the Prompt Registry is read by cg_dspy.tracking (`prompts.stage_versions`,
`runs.run_tables`), which hands the versions over as `PromptVersion`s."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PromptVersion:
    """One registered version of a stage's prompt: its number, instruction, demos, and
    what its tags say (variant, run, optimizer, dev scores; see tracking.prompts.version_row)."""

    version: int
    template: str
    demos: list = field(default_factory=list)
    row: dict = field(default_factory=dict)


def _demos_text(version: PromptVersion) -> list[str]:
    return json.dumps(version.demos, indent=1, ensure_ascii=False, sort_keys=True, default=str).splitlines()


def compare(stages: dict[str, list[PromptVersion]], runs: dict[str, list[dict]], *, a: int | None = None,
            b: int | None = None) -> dict:
    """Per stage, its versions, and the diff of instructions and demos from version `a`
    (default: the first, the untuned one) to `b` (default: the best by dev task-solving
    rate); `runs` passes through as the run tables."""
    out = {}
    for stage, versions in stages.items():
        rows = [v.row for v in versions]
        best = max(rows, key=lambda r: (r["dev_after"] if r["dev_after"] is not None else -1, r["version"]))
        va, vb = (a or rows[0]["version"]), (b or best["version"])
        pick = {v.version: v for v in versions}
        if va not in pick or vb not in pick:
            raise ValueError(f"contextguard.{stage}: versions are {sorted(pick)}; --a {va} / --b {vb} is not one of "
                             "them")
        diff = difflib.unified_diff(pick[va].template.splitlines(), pick[vb].template.splitlines(), f"v{va}",
                                    f"v{vb}", lineterm="")
        demos = difflib.unified_diff(_demos_text(pick[va]), _demos_text(pick[vb]), f"v{va} demos", f"v{vb} demos",
                                     lineterm="")
        out[stage] = {"versions": rows, "a": va, "b": vb, "instructions_diff": "\n".join(diff),
                      "demos_diff": "\n".join(demos)}
    return {"stages": out, "runs": runs}
