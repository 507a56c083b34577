"""Requirement types by the judge LM (`report --rubric-types lm`): each unique rubric is
classified once into the paper's five types (or "other") and the answer is cached beside
the graded file (`<graded>.rubric_types.json`), so a rerun makes no call.

The keyword typer (`reports.analysis.rubric_type`) stays the offline default; its
agreement with hand labels of real CL-bench rubrics is measured in the tests.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dspy

from cg_dspy.evaluation.judge import ask
from cg_dspy.evaluation.rows import graded_rows
from cg_dspy.lms import lm_identity, using
from cg_dspy.method.signatures import RequirementType
from cg_dspy.reports.analysis import RUBRIC_TYPES

OTHER = "other"


def cache_path(graded: str | Path) -> Path:
    graded = Path(graded)
    return graded.with_name(graded.name + ".rubric_types.json")


class LMTyper:
    """`typer(rubric) -> type | None` over rubrics typed by `lm` up front (`type_files`)."""

    name = "lm"

    def __init__(self, lm, *, threads: int = 4):
        self.lm, self.threads = lm, threads
        self.identity = lm_identity(lm)
        self.types: dict[str, str] = {}
        self.calls = 0
        self.failed: list[str] = []
        self.unsaved: list[str] = []  # caches that could not be written
        self.predict = dspy.Predict(RequirementType)

    def describe(self) -> str:
        return f"LM ({self.identity.get('model')})"

    def _read(self, path: Path) -> dict[str, str]:
        """A cache written for this same LM; anything else is ignored (and rewritten)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("typer") != self.identity or not isinstance(data.get("types"), dict):
            return {}
        return {k: v for k, v in data["types"].items() if isinstance(k, str) and v in (*RUBRIC_TYPES, OTHER)}

    def _classify(self, rubric: str) -> str | None:
        try:
            with using(self.lm):
                return ask(self.predict, f"rubric {rubric[:80]!r}", requirement=rubric).requirement_type
        except Exception as exc:  # the LM failed on it: this rubric stays untyped, the report goes on
            self.failed.append(f"{rubric[:80]!r}: {type(exc).__name__}: {str(exc)[:200]}")
            return None

    def type_files(self, files: dict[str, list]) -> None:
        """Type every unique rubric of the graded files: from the caches beside them, then
        one LM call per rubric still unknown; each file's cache is rewritten with its own."""
        per_file = {path: {r for row in graded_rows(rows) for r in row.rubrics} for path, rows in files.items()}
        for path in files:
            self.types.update(self._read(cache_path(path)))
        missing = sorted(set().union(*per_file.values()) - set(self.types))
        with ThreadPoolExecutor(max(1, self.threads)) as pool:
            for rubric, kind in zip(missing, pool.map(self._classify, missing)):
                self.calls += 1
                if kind:
                    self.types[rubric] = kind
        for path, rubrics in per_file.items():
            known = {r: self.types[r] for r in sorted(rubrics) if r in self.types}
            target = cache_path(path)
            partial = target.with_name(f".{target.name}.partial")
            try:
                partial.write_text(json.dumps({"typer": self.identity, "types": known}, indent=1) + "\n",
                                   encoding="utf-8")
                os.replace(partial, target)
            except OSError as exc:  # a read-only folder: the report still gets its types
                partial.unlink(missing_ok=True)
                self.unsaved.append(f"{target}: {exc.strerror or exc}")

    def __call__(self, rubric: str) -> str | None:
        kind = self.types.get(rubric)
        return None if kind in (None, OTHER) else kind
