"""Requirement types by the judge LM (`report --rubric-types lm`): each unique rubric is
classified once into the paper's five types (or "other") and the answer is cached beside
the graded file it came from (`<graded>.rubric_types.json`), so a rerun makes no call.

The keyword typer (`types.rubric_type`) stays the offline default; its
agreement with hand labels of real CL-bench rubrics is measured in the tests.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dspy

from cg_dspy.core.files import OutputRefused, json_kind, write
from cg_dspy.judge.signatures import RequirementType
from cg_dspy.judge.types import OTHER, RUBRIC_TYPES
from cg_dspy.judge.voting import JudgeFailure, ask
from cg_dspy.lms import lm_identity, using


def cache_path(graded: str | Path) -> Path:
    graded = Path(graded)
    return graded.with_name(graded.name + ".rubric_types.json")


MAX_CACHE_BYTES = 64 * 2**20  # a cache beside a graded file is data: read only a sane one
CACHE = json_kind("a requirement-type cache", lambda v: isinstance(v, dict) and "typer" in v)


class LMUnreachable(RuntimeError):
    """The typer's LM did not answer at all: Table 2 would be empty, so say so and stop."""


class LMTyper:
    """`typer(rubric) -> type | None` over rubrics typed by `lm` up front (`type_files`).

    The cache beside a graded file is keyed by the LM's identity and this typer's prompt,
    so another model or an edited prompt types again. The LM's own (DSPy) cache should be
    off: a reply that did not parse is asked again, and at temperature 0 a cached reply
    would only come back."""

    def __init__(self, lm, *, threads: int = 4):
        self.lm, self.threads = lm, threads
        self.predict = dspy.Predict(RequirementType)
        prompt = hashlib.sha256(RequirementType.instructions.encode()).hexdigest()[:16]
        self.identity = {**lm_identity(lm), "prompt": prompt}
        self.types: dict[str, str] = {}
        self.calls = 0
        self.failed: list[str] = []
        self.unsaved: list[str] = []  # caches that could not be written
        self.unreachable: str | None = None
        self.typed = 0  # rubrics of the last type_files that have a type

    def describe(self) -> str:
        return f"LM ({self.identity.get('model')})"

    def _read(self, path: Path) -> dict[str, str]:
        """A cache written for this same LM and prompt; anything else is ignored."""
        try:
            if not path.is_file() or path.stat().st_size > MAX_CACHE_BYTES:
                return {}
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("typer") != self.identity or not isinstance(data.get("types"), dict):
            return {}
        return {k: v for k, v in data["types"].items() if isinstance(k, str) and v in (*RUBRIC_TYPES, OTHER)}

    def _classify(self, rubric: str) -> str | None:
        if self.unreachable:
            return None
        try:
            with using(self.lm):
                return ask(self.predict, f"rubric {rubric[:80]!r}", rollout=None, requirement=rubric).requirement_type
        except JudgeFailure as exc:  # replies that never parsed: this rubric stays untyped
            self.failed.append(str(exc))
        except Exception as exc:  # the LM did not answer: no other rubric asks it again
            self.unreachable = self.unreachable or f"{type(exc).__name__}: {str(exc)[:300]}"
        return None

    def type_files(self, files: dict[str, Iterable[str]]) -> None:
        """Type every unique rubric of the graded files (path -> its rubrics): from the caches
        beside them, then one LM call per rubric still unknown; a file's cache is rewritten
        when it changed. Raises LMUnreachable when the LM answered none of them."""
        per_file = {path: set(rubrics) for path, rubrics in files.items()}
        cached = {path: self._read(cache_path(path)) for path in files}
        for known in cached.values():
            self.types.update(known)
        wanted = set().union(*per_file.values())
        missing = sorted(wanted - set(self.types))
        with ThreadPoolExecutor(max(1, self.threads)) as pool:
            for rubric, kind in zip(missing, pool.map(self._classify, missing)):
                self.calls += 1
                if kind:
                    self.types[rubric] = kind
        self.typed = len(wanted & set(self.types))
        if self.unreachable and not any(r in self.types for r in missing):
            raise LMUnreachable(f"the requirement typer's LM ({self.identity.get('model')}) did not answer "
                                f"({self.unreachable}); no requirement types, nothing cached")
        for path, rubrics in per_file.items():
            known = {r: self.types[r] for r in sorted(rubrics) if r in self.types}
            if known != cached[path]:
                self._save(cache_path(path), known)

    def _save(self, target: Path, known: dict[str, str]) -> None:
        data = json.dumps({"typer": self.identity, "types": known}, indent=1) + "\n"
        try:
            write(target, data.encode("utf-8"), CACHE)
        except OutputRefused as exc:  # a planted link or a file of someone else's: left alone
            self.unsaved.append(str(exc))
        except OSError as exc:  # a read-only folder: the report still gets its types
            self.unsaved.append(f"{target}: {exc.strerror or exc}")

    def __call__(self, rubric: str) -> str | None:
        kind = self.types.get(rubric)
        return None if kind in (None, OTHER) else kind
