"""Several replicas of one LM behind one `dspy.LM`: each task pinned to one endpoint for
all its stages, a failing replica cooled down and its tasks moved to the others.

A prefix-caching server (vLLM, SGLang, llama.cpp) reuses a task's long context only when
the task's draft, audit, checker and revision reach the replica that holds its prefix;
a round-robin or random balancer sends them elsewhere and every stage prefills the whole
context again. So a task is pinned: `pinned(key)` marks the work of one task (the runner
wraps each task in it; a program call outside any task is one), and its first call
picks the replica with the fewest tasks in flight (then the fewest so far), which it
keeps. A replica that refuses or drops the connection is down: it is taken out for
`COOLDOWN_SECONDS` and the call, with every task pinned there, goes on elsewhere. A 5xx,
429 or timeout may be the request's own fault, so the call is tried on another replica
and the first is taken out only when the other answers; when every replica gives the
same kind of error the request is at fault, the call fails as on one endpoint, and no
replica is taken out. With every replica down the call fails, and a rerun continues.
All replicas must serve one model: a reply naming another model than the first
replica's stops every call (answers would mix models).

`Pinning` is the policy, pure; `ReplicaLM` the LM that calls through it.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlparse

import dspy
from dspy import lm15

COOLDOWN_SECONDS = 30.0
# This LM relays the adapter's call, `messages=` included; DSPy's deprecation of that is
# addressed to the adapter, not to whoever runs it.
warnings.filterwarnings("ignore", message="Passing OpenAI-style message dictionaries",
                        category=DeprecationWarning, module=r"cg_dspy\.lms\.replicas")
_TASK: contextvars.ContextVar[object] = contextvars.ContextVar("cg_dspy_pinned_task", default=None)
_POOLS: weakref.WeakSet = weakref.WeakSet()  # ReplicaLMs alive, told when a pinned task ends
_POOLS_LOCK = threading.Lock()


def _register(pool: ReplicaLM) -> None:
    with _POOLS_LOCK:
        _POOLS.add(pool)


@contextlib.contextmanager
def pinned(key: object) -> Iterator[None]:
    """Calls in this block (this thread, and what it hands its context to) are one task's."""
    token = _TASK.set(key)
    try:
        yield
    finally:
        _TASK.reset(token)
        with _POOLS_LOCK:
            pools = list(_POOLS)
        for pool in pools:
            pool.release(key)


@contextlib.contextmanager
def one_task() -> Iterator[None]:
    """A program call's calls as one task, unless they already are part of one (the runner
    pins each task; an optimizer's or a library's program call is pinned here)."""
    if _TASK.get() is not None:
        yield
        return
    with pinned(object()):
        yield


def endpoints(text: str | None) -> tuple[list[str], list[str]]:
    """The endpoints a comma-separated `--api-base` list names, each once, and those
    listed twice. Raises ValueError naming one that is not an http(s) URL."""
    found: list[str] = []
    twice: list[str] = []
    for part in (text or "").split(","):
        base = part.strip().rstrip("/")
        if not base:
            continue
        parsed = urlparse(base)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"endpoint {part.strip()!r}: not an http(s) URL (write http://HOST:PORT/v1)")
        if base in found:
            twice.append(base)
        else:
            found.append(base)
    return found, twice


@dataclass
class Pinning:
    """Which replica serves which task; no I/O, the clock is passed in."""

    replicas: int
    cooldown: float = COOLDOWN_SECONDS
    pins: dict = field(default_factory=dict)
    in_flight: list[int] = field(default_factory=list)
    assigned: list[int] = field(default_factory=list)
    down_until: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.in_flight = [0] * self.replicas
        self.assigned = [0] * self.replicas
        self.down_until = [0.0] * self.replicas

    def up(self, now: float) -> list[int]:
        return [i for i in range(self.replicas) if self.down_until[i] <= now]

    def pin(self, key: object, now: float, avoid: frozenset[int] = frozenset()) -> int | None:
        """The key's replica: kept while it is up (and not to be avoided), else the least busy
        one up (None: none left)."""
        current = self.pins.get(key)
        if current is not None and self.down_until[current] <= now and current not in avoid:
            return current
        if current is not None:
            self.release(key)
        alive = [i for i in self.up(now) if i not in avoid]
        if not alive:
            return None
        chosen = min(alive, key=lambda i: (self.in_flight[i], self.assigned[i], i))
        self.pins[key] = chosen
        self.in_flight[chosen] += 1
        self.assigned[chosen] += 1
        return chosen

    def release(self, key: object) -> None:
        index = self.pins.pop(key, None)
        if index is not None:
            self.in_flight[index] -= 1

    def fail(self, index: int, now: float) -> None:
        """Replica `index` failed: out until the cool-down ends; its tasks move on their next call."""
        self.down_until[index] = now + self.cooldown


@dataclass
class EndpointStats:
    tasks: int = 0
    failures: int = 0
    seconds: float = 0.0


class ReplicasDown(lm15.TransportError):
    """Every replica is cooling down after a failure."""


class ReplicaMismatch(lm15.ConfigurationError):
    """Two replicas answered as different models."""


def failure_kind(exc: BaseException) -> str | None:
    """"down" when the replica is unreachable (refused or dropped connection), "busy" for a
    5xx, 429 or timeout (the replica's fault or the request's), None when the request is
    bad (as lm15 raises it, or as DSPy wraps it)."""
    from dspy.utils import exceptions as dspy_errors

    from cg_dspy.lms.endpoint import GenerationTimedOut

    if isinstance(exc, (lm15.InvalidRequestError, lm15.AuthError, lm15.ConfigurationError,
                        dspy_errors.LMInvalidRequestError, dspy_errors.LMAuthError)):
        return None
    busy = (lm15.ServerError, lm15.TimeoutError, lm15.RateLimitError, GenerationTimedOut, dspy_errors.LMServerError,
            dspy_errors.LMTimeoutError, dspy_errors.LMRateLimitError, TimeoutError)
    down = (lm15.TransportError, dspy_errors.LMTransportError, ConnectionError)
    while exc is not None:  # DSPy may wrap the engine's error
        if isinstance(exc, busy):
            return "busy"
        if isinstance(exc, down):
            return "down"
        exc = exc.__cause__
    return None


class ReplicaLM(dspy.BaseLM):
    """One LM over several endpoints of the same model (see the module docstring)."""

    def __init__(self, lms: list[dspy.LM], bases: list[str], *, cooldown: float = COOLDOWN_SECONDS):
        super().__init__(model=lms[0].model)
        self.lms, self.bases = lms, bases
        self.kwargs = lms[0].kwargs
        self.pinning = Pinning(len(lms), cooldown)
        self.stats = [EndpointStats() for _ in lms]
        self.mismatch: str | None = None
        self._lock = threading.Lock()
        _register(self)

    # what DSPy and the adapter read of an LM: the first replica's (all serve one model)
    @property
    def engine(self):
        return self.lms[0].engine

    @property
    def supported_params(self) -> set[str]:
        return self.lms[0].supported_params

    @property
    def supports_response_schema(self) -> bool:
        return self.lms[0].supports_response_schema

    def describe(self) -> dict:
        """What a results file records: every endpoint, in any order the user gave them."""
        return {**self.lms[0].engine.describe(), "api_base": sorted(self.bases)}

    def endpoint_stats(self, since: dict | None = None) -> dict[str, dict]:
        """Per endpoint, in the order given: tasks pinned there, requests sent (a cache hit
        sends none), failures, seconds in calls; so far, or since an earlier reading (one
        run's share of an LM that repeats and bench methods share)."""
        with self._lock:
            now = {base: {"tasks": s.tasks, "calls": getattr(lm.engine, "sent", 0), "failures": s.failures,
                          "seconds": s.seconds} for base, s, lm in zip(self.bases, self.stats, self.lms)}
        return {base: {k: round(v - ((since or {}).get(base) or {}).get(k, 0), 2) for k, v in counts.items()}
                for base, counts in now.items()}

    def release(self, key: object) -> None:
        with self._lock:
            self.pinning.release(key)

    def copy(self, **changes) -> ReplicaLM:
        """Every replica copied with `changes` (a repeat's rollout id, an optimizer's counting
        engine wrapped around each replica's own); pins and counts stay shared."""
        wrap = changes.pop("engine_wrapper", None)
        twin = super().copy(**changes)
        twin.lms = [lm.copy(**changes, **({"engine": wrap(lm.engine)} if wrap else {})) for lm in self.lms]
        twin.kwargs = twin.lms[0].kwargs
        _register(twin)
        return twin

    def __call__(self, *args, **kwargs):
        return self._routed(lambda lm: lm(*args, **kwargs))

    def forward(self, *args, **kwargs):
        return self._routed(lambda lm: lm.forward(*args, **kwargs))

    async def acall(self, *args, **kwargs):  # DSPy's async path: pinned the same way, in this thread
        return self._routed(lambda lm: lm(*args, **kwargs))

    def _routed(self, call):
        with one_task():  # a call outside any task is one
            return self._pinned_call(_TASK.get(), call)

    def _pinned_call(self, key: object, call):
        tried: set[int] = set()
        suspects: list[int] = []  # replicas that gave a 5xx, 429 or timeout to this call
        last: BaseException | None = None
        while True:
            with self._lock:
                if self.mismatch:
                    raise ReplicaMismatch(self.mismatch)
                before = self.pinning.pins.get(key)
                index = self.pinning.pin(key, time.monotonic(), avoid=frozenset(tried))
                if index is not None and index != before:  # a task (or one moved off a failed replica) arrives
                    self.stats[index].tasks += 1
            if index is None:
                if last is not None and suspects and len(tried) == len(self.lms):
                    raise last  # every replica refused this request the same way: the request is at fault
                why = f"last error: {last}" if last else "each is cooling down after a failure"
                raise ReplicasDown(f"every replica is down ({', '.join(self.bases)}); {why}") from last
            tried.add(index)
            start = time.perf_counter()
            try:
                result = call(self.lms[index])
            except Exception as exc:
                kind = failure_kind(exc)
                with self._lock:
                    self.stats[index].seconds += time.perf_counter() - start
                    if kind is None:
                        raise
                    self.stats[index].failures += 1
                    if kind == "down":
                        self.pinning.fail(index, time.monotonic())
                    else:
                        suspects.append(index)
                last = exc
                continue
            with self._lock:
                self.stats[index].seconds += time.perf_counter() - start
                for suspect in suspects:  # another replica answered: those were the replicas' fault
                    self.pinning.fail(suspect, time.monotonic())
                self._check_model()
            return result

    def _check_model(self) -> None:
        served = {i: getattr(lm.engine, "served_model", None) for i, lm in enumerate(self.lms)}
        named = {m for m in served.values() if m}
        if len(named) > 1:
            self.mismatch = ("the replicas serve different models (" + "; ".join(
                f"{self.bases[i]}: {m}" for i, m in served.items() if m) + "): answers would mix models; give "
                "--api-base only endpoints of one model")
            raise ReplicaMismatch(self.mismatch)
