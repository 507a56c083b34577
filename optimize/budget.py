"""What an optimize run spends, counted where a request leaves: LM calls per role (task
LM, judge, reflection) at the engine, so a reply DSPy's cache serves is not a call; a
cap that stops the run; progress on stderr.

The count wraps each LM's engine (`counted`): the project's engines (every
OpenAI-compatible endpoint, the embedded model) and any custom engine. A LiteLLM model
string with no engine of ours (`ollama_chat/...`) cannot be counted here.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from cg_dspy.lms.replicas import ReplicaLM

ROLES = ("task", "judge", "reflection")
PROGRESS_SECONDS = 15.0


class BudgetExhausted(BaseException):
    """The run reached its cap (`--max-calls`). A BaseException on purpose: DSPy's parallel
    evaluation scores a task that raises an Exception as 0 and goes on, which would let
    an optimizer "select" among programs it never really ran; this stops it instead."""


@dataclass
class Ledger:
    """Calls per role, thread-safe, against an optional cap and estimate."""

    cap: int | None = None
    estimate: int | None = None
    progress: bool = False
    calls: Counter = field(default_factory=Counter)
    best: float | None = None  # the best dev score of a candidate so far (the tracker sets it)
    candidates: int = 0  # programs scored on the whole dev set so far
    capped: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _shown: float = field(default_factory=time.monotonic)

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def charge(self, role: str) -> None:
        """Count one call of `role`, or raise BudgetExhausted when the cap is spent (the call
        is not sent)."""
        with self._lock:
            if self.cap is not None and self.total >= self.cap:
                self.capped = True
                raise BudgetExhausted(f"the cap of {self.cap} LM calls (--max-calls) is reached")
            self.calls[role] += 1
            due = self.progress and time.monotonic() - self._shown > PROGRESS_SECONDS
            if due:
                self._shown = time.monotonic()
        if due:
            self.say()

    def say(self) -> None:
        """One progress line on stderr: calls spent against the estimate, the best dev score."""
        of = f" of ~{self.estimate:,} estimated" if self.estimate else ""
        cap = f", cap {self.cap:,}" if self.cap else ""
        roles = ", ".join(f"{role} {self.calls[role]:,}" for role in ROLES if self.calls[role])
        best = f"; {self.candidates} candidate(s) scored on dev, the best {self.best:.3f}" if self.best is not None \
            else ""
        print(f"optimize: {self.total:,} LM calls{of}{cap} ({roles or 'none yet'}){best}", file=sys.stderr,
              flush=True)

    def as_dict(self) -> dict:
        return {**{role: self.calls[role] for role in ROLES}, "total": self.total}


class CountingEngine:
    """An engine that charges the ledger for each call of its role, then sends it on."""

    def __init__(self, inner, role: str, ledger: Ledger):
        self.inner, self.role, self.ledger = inner, role, ledger

    def complete(self, request):
        self.ledger.charge(self.role)
        return self.inner.complete(request)

    def stream(self, request):
        self.ledger.charge(self.role)
        return self.inner.stream(request)

    def __getattr__(self, name):  # supports_response_schema, supported_params, describe, close, …
        return getattr(self.inner, name)


def counted(lm, role: str, ledger: Ledger):
    """`lm`, its calls charged to `role`; the LM's identity (model, endpoint) unchanged."""
    engine = getattr(lm, "engine", None)
    if engine is None or isinstance(engine, str):
        raise ValueError(f"{getattr(lm, 'model', lm)}: its calls go through LiteLLM's own client, which this project "
                         "cannot count or cap; use openai/<name> with --api-base (any OpenAI-compatible server)")
    if isinstance(lm, ReplicaLM):  # every replica's calls charged
        return lm.copy(engine_wrapper=lambda inner: CountingEngine(inner, role, ledger))
    return lm.copy(engine=CountingEngine(engine, role, ledger))
