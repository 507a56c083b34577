"""Append-only JSONL result files that survive being killed at any moment.

Each finished task is one line written with a single `os.write` on an O_APPEND file
descriptor, so concurrent workers never interleave and a SIGKILL leaves at most a torn
last line. Opening a store repairs that: the torn tail is cut, failed rows and
duplicates are dropped (atomically, through a temporary file and `os.replace`), and
the ids already finished are skipped by the caller.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Every complete, valid JSON line of a result file (a torn tail is ignored)."""
    rows = []
    p = Path(path)
    if not p.exists():
        return rows
    with open(p, "rb") as fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # torn by a kill mid-write
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def row_id(row: dict) -> str | None:
    """A row's task id: `idx`, else the metadata's `task_id`."""
    if row.get("idx") is not None:
        return str(row["idx"])
    meta = row.get("metadata") or {}
    return str(meta["task_id"]) if meta.get("task_id") is not None else None


class ResultStore:
    """One result file; rows keyed by task id; rows with an `error` are retried."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: dict[str, dict] = {}
        self._recover()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _recover(self) -> None:
        raw = self.path.read_bytes() if self.path.exists() else b""
        kept: dict[str, dict] = {}
        for row in read_rows(self.path):
            rid = row_id(row)
            if rid is not None and not row.get("error"):
                kept[rid] = row
        self.rows = kept
        self._rewrite(raw)

    def _rewrite(self, current: bytes | None = None) -> None:
        """Make the file hold exactly `self.rows`, atomically."""
        clean = b"".join(_encode(r) for r in self.rows.values())
        if clean != current:
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_bytes(clean)
            os.replace(tmp, self.path)

    def discard(self, ids) -> None:
        """Forget finished rows (their input changed), so they are done again."""
        ids = set(ids) & set(self.rows)
        if not ids:
            return
        self.close()
        for rid in ids:
            del self.rows[rid]
        self._rewrite()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def done(self) -> set[str]:
        return set(self.rows)

    def append(self, row: dict) -> None:
        """Write one row as one line; safe from many threads at once."""
        data = _encode(row)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        rid = row_id(row)
        if rid is not None and not row.get("error"):
            self.rows[rid] = row

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _encode(row: dict) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
