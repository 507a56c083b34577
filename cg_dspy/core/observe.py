"""Who watches a run, without the code being watched knowing who it is.

The method opens a span around each task and stage (`span`), and grading hands each
graded task over (`graded`); nobody watches by default, and then both cost nothing.
Tracing (cg_dspy.tracking) installs an `Observer` for a block with `observing`. The
observer is process-wide, not a context variable: the method runs in worker threads
(the runner's, DSPy's parallel executor's) that carry no context of their caller.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Span(Protocol):
    """A span as the watched code sees it."""

    trace_ref: dict | None  # where the task's trace is, for whoever reads the row later

    def set(self, outputs: object = None, **attributes) -> None: ...


class Observer(Protocol):
    """Opens spans and takes graded tasks (typed: `judge.verdicts.GradedTask`)."""

    def span(self, name: str, attributes: dict) -> AbstractContextManager[Span]: ...

    def graded(self, task) -> None: ...


class _Unwatched:
    """The span when nothing watches: every call is a no-op."""

    trace_ref = None

    def set(self, outputs: object = None, **attributes) -> None:
        pass


UNWATCHED = _Unwatched()
_observer: Observer | None = None
_lock = threading.Lock()


@contextmanager
def observing(observer: Observer) -> Iterator[None]:
    """`observer` watches every span and graded task in this block (and its threads)."""
    global _observer
    with _lock:
        previous, _observer = _observer, observer
    try:
        yield
    finally:
        with _lock:
            _observer = previous


@contextmanager
def span(name: str, **attributes) -> Iterator[Span]:
    """A span named `name` when something observes, else UNWATCHED."""
    observer = _observer
    if observer is None:
        yield UNWATCHED
        return
    with observer.span(name, attributes) as opened:
        yield opened


def watched() -> bool:
    return _observer is not None


def graded(task) -> None:
    """Hand a graded task to whoever watches (for its trace), else nothing."""
    observer = _observer
    if observer is not None:
        observer.graded(task)


# Where a task's trace is, as a row records it: a trace id (inline tracing) or the run whose
# traces hold it (the trace writer). A reference in another form is not followed.
TRACE_REF = {"trace_id": re.compile(r"tr-[0-9a-f]{32}"), "run_id": re.compile(r"[0-9a-f]{32}")}


def trace_reference(value) -> dict | None:
    """`value` if it is a trace reference of the form this project writes, else None."""
    if isinstance(value, dict) and len(value) == 1:
        (key, found), = value.items()
        if key in TRACE_REF and isinstance(found, str) and TRACE_REF[key].fullmatch(found):
            return {key: found}
    return None
