"""Run many tasks concurrently into a ResultStore: N in flight, progress, clean Ctrl-C.

The LM is the bottleneck, so workers are threads that spend their time waiting on it.
Finished rows are appended as they complete (order does not matter; rows carry ids).
One task that raises becomes a row with an `error`; the others go on.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from tqdm import tqdm

from cg_dspy.clbench.store import ResultStore
from cg_dspy.core.redact import scrub


@dataclass
class Outcome:
    """What a batch did: the rows it wrote, what failed, whether it was interrupted."""

    rows: list[dict] = field(default_factory=list)
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False
    seconds: float = 0.0


def execute(
    jobs: Iterable[tuple[str, Callable[[], dict]]],
    store: ResultStore,
    *,
    threads: int = 4,
    desc: str = "tasks",
    postfix: Callable[[list[dict]], dict] | None = None,
    progress: bool = True,
    error_row: Callable[[str, str], dict] | None = None,
) -> Outcome:
    """Run `jobs` (task id, thunk returning a row) with at most `threads` in flight."""
    outcome = Outcome()
    done = store.done()
    pending = []
    for idx, job in jobs:
        if idx in done:
            outcome.skipped += 1
        else:
            pending.append((idx, job))
    start = time.perf_counter()
    bar = tqdm(total=len(pending), desc=desc, disable=not progress, dynamic_ncols=True)
    queue = iter(pending)
    in_flight: dict[Future, str] = {}
    stop = threading.Event()
    shown = 0.0  # when the progress postfix was last refreshed

    def guarded(idx: str, job: Callable[[], dict]) -> dict:
        try:
            return job()
        except Exception as exc:  # one bad task never stops the others
            reason = scrub(f"{type(exc).__name__}: {exc}".strip())
            row = error_row(idx, reason) if error_row else {"idx": idx}
            row["error"] = reason
            row["error_detail"] = scrub(traceback.format_exc(limit=3)[-2000:])
            return row

    def refill(pool: ThreadPoolExecutor) -> None:
        while not stop.is_set() and len(in_flight) < threads:
            nxt = next(queue, None)
            if nxt is None:
                return
            in_flight[pool.submit(guarded, *nxt)] = nxt[0]

    def drain(pool: ThreadPoolExecutor) -> None:
        nonlocal shown
        while in_flight:
            finished, _ = wait(list(in_flight), return_when=FIRST_COMPLETED)
            for fut in finished:
                idx = in_flight.pop(fut)
                row = fut.result()
                store.append(row)
                outcome.rows.append(row)
                if row.get("error"):
                    outcome.failed.append((idx, row["error"]))
                bar.update(1)
            # The postfix summarizes every row so far: refresh it twice a second, not per row.
            if postfix and not bar.disable and time.perf_counter() - shown > 0.5:
                shown = time.perf_counter()
                bar.set_postfix(postfix(outcome.rows), refresh=False)
            refill(pool)

    def on_sigint(signum, frame):
        if not stop.is_set():
            stop.set()
            outcome.interrupted = True
            bar.write(f"Interrupted: finishing {len(in_flight)} task(s) in flight, then stopping.", file=sys.stderr)

    # Ctrl-C (and SIGTERM) only stops new work; rows in flight finish and are written.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, on_sigint) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            refill(pool)
            drain(pool)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    bar.close()
    outcome.seconds = time.perf_counter() - start
    return outcome
