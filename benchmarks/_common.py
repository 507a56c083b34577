"""Shared helpers for the benchmarks: a server in its own process, timing, result files."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@contextmanager
def server_process(latency: float = 0.0):
    """The local OpenAI-compatible server in a separate process (its CPU is not ours)."""
    proc = subprocess.Popen([sys.executable, "-m", "cg_dspy.testing.server", "--fast", "--latency", str(latency)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = proc.stdout.readline().strip()
        yield url
    finally:
        proc.stdin.close()
        proc.terminate()
        proc.wait(timeout=10)


def remote_lm(url: str, **kwargs):
    from cg_dspy.lms import LMSettings, build_lm

    return build_lm(LMSettings(model="openai/bench-model", api_base=url, cache=False, **kwargs))


def median(values):
    return statistics.median(values) if values else None


def verdict(ok: bool) -> str:
    return "MET" if ok else "NOT MET"


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return path


def table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    widths = [max(len(str(h)), *(len(fmt(r[i])) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(fmt(v).ljust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def finish(name: str, header: list[str], rows: list[list], targets: dict[str, bool], payload: dict) -> dict:
    """Print the table and each target's verdict; write the JSON result."""
    print(table(header, rows))
    for target, ok in targets.items():
        print(f"{target}: {verdict(ok)}")
    payload = {**payload, "targets": targets}
    print(f"\nwritten: {write_result(name, payload)}")
    return payload
