"""Running one stage: count its LM calls and tokens, turn a bad output into a recorded
fallback instead of a failed task.

Only output that does not parse or validate is a stage failure. Transport errors (a
server that is down, a context window that overflows) propagate: the task fails with
its reason, as the paper counts missing generations as unsolved.
"""

from __future__ import annotations

from collections import defaultdict

import pydantic
from dspy.utils.exceptions import AdapterParseError
from dspy.utils.usage_tracker import track_usage


class StageFailure(Exception):
    """A stage produced output that could not be used; the reason is recorded."""


class Stages:
    """Per-task bookkeeping: calls and tokens per stage, failures in order."""

    def __init__(self) -> None:
        self.cost: dict[str, dict[str, int]] = defaultdict(
            lambda: {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
        )
        self.failures: list[str] = []

    def run(self, name: str, predictor, /, **inputs):
        """Call `predictor(**inputs)` as stage `name`; raise StageFailure on bad output."""
        with track_usage() as tracker:
            try:
                return predictor(**inputs)
            except (AdapterParseError, pydantic.ValidationError) as exc:
                reason = f"{name}: unusable output ({type(exc).__name__}: {_first_line(exc)})"
                self.failures.append(reason)
                raise StageFailure(reason) from exc
            finally:
                self._account(name, tracker)

    def _account(self, name: str, tracker) -> None:
        entry = self.cost[name]
        for usages in tracker.usage_data.values():
            for usage in usages:
                entry["calls"] += 1
                entry["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
                entry["completion_tokens"] += int(usage.get("completion_tokens") or 0)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
