"""Running one stage: count its LM calls, tokens and how its replies ended; turn a bad
output into a recorded fallback instead of a failed task.

Only output that does not parse or validate is a stage failure, and it is asked for
once more before it counts (a fresh sample, not the cached reply). Transport errors
(a server that is down, a context window that overflows) propagate: the task fails
with its reason, as the paper counts missing generations as unsolved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import dspy
import pydantic
from dspy.utils.exceptions import AdapterParseError
from dspy.utils.usage_tracker import UsageTracker

from cg_dspy.core.cost import COST_KEYS
from cg_dspy.core.observe import UNWATCHED, span
from cg_dspy.lms import replies

PARSE_ATTEMPTS = 2  # a stage's output that does not parse is asked for once more
RETRY_ROLLOUTS = 1000  # rollout ids a repeat's retries may use
RETRY_TEMPERATURE = 0.3


class StageFailure(Exception):
    """A stage produced output that could not be used; the reason is recorded."""


class Stages:
    """Per-task bookkeeping: LM calls, cache hits, tokens, truncated replies and reasoning
    per stage; failures in order; the structured-output mode each typed stage got."""

    def __init__(self) -> None:
        self.cost: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COST_KEYS, 0))
        self.failures: list[str] = []
        self.structured_output: dict[str, str] = {}
        self.cut: dict[str, bool] = {}  # whether the reply a stage's output was read from was cut

    def run(self, name: str, predictor, /, **inputs):
        """Call `predictor(**inputs)` as stage `name`; raise StageFailure on bad output."""
        with span(name) as watched:
            out, before, failed = None, dict(self.cost[name]), len(self.failures)
            try:
                out = self._attempts(name, predictor, inputs)
                return out
            finally:  # this call's own cost and failures (a stage may run once per round)
                watched.set(**{k: v - before[k] for k, v in self.cost[name].items()},
                            failures=self.failures[failed:],
                            outputs=None if out is None or watched is UNWATCHED else shown(out))

    def _attempts(self, name: str, predictor, inputs: dict):
        for attempt in range(PARSE_ATTEMPTS):
            config = retry_config(attempt)
            answered = False
            with counting_calls() as tracker, replies.collecting() as facts:
                try:
                    out = predictor(**inputs, **({"config": config} if config else {}))
                    answered = True
                    self.cut[name] = any(f.truncated for f in facts)
                    if self.cut[name]:
                        self.failures.append(f"{name}: the reply was cut at max_tokens; what it holds is used")
                    return out
                except (AdapterParseError, pydantic.ValidationError) as exc:
                    answered = True
                    reason = _reason(name, exc, facts)
                    self.failures.append(reason if attempt + 1 == PARSE_ATTEMPTS else f"{reason}; asked again")
                finally:
                    self._account(name, tracker, facts, answered)
        raise StageFailure(self.failures[-1])

    def _account(self, name: str, tracker: CallTracker, facts: list[replies.CallFacts], answered: bool) -> None:
        entry = self.cost[name]
        entry["calls"] += tracker.calls
        if answered and not tracker.calls:
            entry["cached"] += 1  # an answer without an LM call came from DSPy's cache
        for usages in tracker.usage_data.values():
            for usage in usages:
                entry["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
                entry["completion_tokens"] += int(usage.get("completion_tokens") or 0)
        for fact in facts:
            entry["truncated"] += fact.truncated
            entry["reasoning_chars"] += fact.reasoning_chars
            entry["reasoning_tokens"] += fact.reasoning_tokens
            entry["cached_prompt_tokens"] += fact.cached_prompt_tokens
            if fact.structured_output:
                self.structured_output[name] = fact.structured_output


def shown(prediction) -> dict:
    """A stage's typed outputs as plain JSON values: what its span shows as outputs
    (the audit's quadrants, a checker's report, the revised answer)."""
    return {k: [i.model_dump() if isinstance(i, pydantic.BaseModel) else i for i in v] if isinstance(v, list)
            else v.model_dump() if isinstance(v, pydantic.BaseModel) else v for k, v in prediction.items()}


def retry_config(attempt: int) -> dict:
    """Call options for a stage's `attempt`-th ask: a retry is a fresh sample, not the
    cached reply, and not greedy (a greedy model would repeat the unusable reply)."""
    if not attempt:
        return {}
    kwargs = dspy.settings.lm.kwargs if dspy.settings.lm else {}
    temperature = max(RETRY_TEMPERATURE, float(kwargs.get("temperature") or 0.0))
    # A repeated run samples with its own rollout id (harness.run(repeat=...)); its retries
    # must not land on another repeat's cache entries.
    return {"rollout_id": RETRY_ROLLOUTS * int(kwargs.get("rollout_id") or 0) + attempt, "temperature": temperature}


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


def _reason(name: str, exc: Exception, facts: list[replies.CallFacts]) -> str:
    """Why a stage's output could not be used, in words a user can act on."""
    thought = sum(f.reasoning_chars for f in facts)
    if thought and "empty" in str(exc):
        reason = f"{name}: unusable output (no answer: the reply held only reasoning, {thought} characters)"
    else:
        reason = f"{name}: unusable output ({type(exc).__name__}: {_first_line(exc)})"
    if any(f.truncated for f in facts):
        reason += "; the reply was cut at max_tokens"
    return reason


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
