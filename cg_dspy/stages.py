"""Running one stage: count its LM calls and tokens, turn a bad output into a recorded
fallback instead of a failed task.

Only output that does not parse or validate is a stage failure. Transport errors (a
server that is down, a context window that overflows) propagate: the task fails with
its reason, as the paper counts missing generations as unsolved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import dspy
import pydantic
from dspy.utils.exceptions import AdapterParseError
from dspy.utils.usage_tracker import UsageTracker


class StageFailure(Exception):
    """A stage produced output that could not be used; the reason is recorded."""


class Stages:
    """Per-task bookkeeping: LM calls, cache hits and tokens per stage; failures in order."""

    def __init__(self) -> None:
        self.cost: dict[str, dict[str, int]] = defaultdict(
            lambda: {"calls": 0, "cached": 0, "prompt_tokens": 0, "completion_tokens": 0}
        )
        self.failures: list[str] = []

    def run(self, name: str, predictor, /, *, raw_text_ok: bool = False, **inputs):
        """Call `predictor(**inputs)` as stage `name`; raise StageFailure on bad output.

        With `raw_text_ok`, a stage whose one output is free text takes the LM's raw
        reply when it is not the JSON asked for: a model that answers in plain prose
        still answered.
        """
        answered = False
        with counting_calls() as tracker:
            try:
                out = predictor(**inputs)
                answered = True
                return out
            except (AdapterParseError, pydantic.ValidationError) as exc:
                answered = True
                raw = (getattr(exc, "lm_response", None) or "").strip()
                fields = list(predictor.signature.output_fields)
                if raw_text_ok and raw and len(fields) == 1:
                    self.failures.append(f"{name}: reply was not JSON; its raw text is used")
                    return dspy.Prediction(**{fields[0]: raw})
                reason = f"{name}: unusable output ({type(exc).__name__}: {_first_line(exc)})"
                self.failures.append(reason)
                raise StageFailure(reason) from exc
            finally:
                self._account(name, tracker, answered)

    def _account(self, name: str, tracker: CallTracker, answered: bool) -> None:
        entry = self.cost[name]
        entry["calls"] += tracker.calls
        if answered and not tracker.calls:
            entry["cached"] += 1  # an answer without an LM call came from DSPy's cache
        for usages in tracker.usage_data.values():
            for usage in usages:
                entry["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
                entry["completion_tokens"] += int(usage.get("completion_tokens") or 0)


class CallTracker(UsageTracker):
    """DSPy's usage tracker that also counts LM calls.

    DSPy reports every call that was not a cache hit to the tracker, but UsageTracker
    drops the report when the server sent no usage (many OpenAI-compatible servers
    do not), so counting its entries would count such calls as zero.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def add_usage(self, lm: str, usage_entry: dict) -> None:
        self.calls += 1
        super().add_usage(lm, usage_entry)


@contextmanager
def counting_calls() -> Iterator[CallTracker]:
    """Like `dspy.track_usage`, with a CallTracker; usage still reaches an outer tracker."""
    tracker = CallTracker()
    parent = dspy.settings.usage_tracker
    with dspy.settings.context(usage_tracker=tracker):
        try:
            yield tracker
        finally:
            if parent is not None:
                for lm, entries in tracker.usage_data.items():
                    parent.usage_data[lm].extend(entries)
                if isinstance(parent, CallTracker):
                    parent.calls += tracker.calls


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
