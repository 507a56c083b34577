"""Append-only JSONL result files that survive being killed, and that belong to one run.

Each finished task is one line written with a single `os.write` on an O_APPEND file
descriptor, so concurrent workers never interleave and a SIGKILL leaves at most a torn
last line. Opening a store repairs that: the torn tail is cut, failed rows and
duplicates are dropped (atomically, through a temporary file and `os.replace`), and
the ids already finished are skipped by the caller.

A store is also careful about what it writes over (`core.files` holds the rules every
output shares):
- `--out` must not be a link, a directory or one of the run's inputs (the same file by
  path or inode);
- an existing file must be one this project wrote for the same kind of output
  (every row carries a `cg_dspy` block: kind, what produced it, and a digest of the
  task's input) unless `force`, which starts it anew;
- rows written by different settings refuse the resume (the differences are named)
  unless `resume_anyway`; a row whose task input changed is done again;
- one writer at a time: an advisory lock (`OUT.lock`, fcntl, never through a link) is
  held while the store is open; a second process is told who holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from cg_dspy.clbench.rows import read_jsonl, row_id
from cg_dspy.core import files
from cg_dspy.core.files import OutputLocked, OutputRefused

KINDS = ("results", "graded")


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Every readable row of a file this project wrote (unreadable lines are skipped);
    readers of files from elsewhere use `rows.read_jsonl`, which names them."""
    return [row for _, row in read_jsonl(path).rows] if Path(path).exists() else []


def differences(expected: dict, found: dict, prefix: str = "") -> list[str]:
    """`key: found -> expected` for every setting that differs, nested keys dotted."""
    out = []
    for key in sorted(set(expected) | set(found)):
        a, b = found.get(key), expected.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(b, a, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {json.dumps(a)} -> {json.dumps(b)}")
    return out


class ResultStore:
    """One output file of `kind`, written by one run; rows keyed by task id; rows with an
    `error` are retried."""

    def __init__(self, path: str | os.PathLike, *, kind: str = "results", run: dict | None = None,
                 inputs: tuple = (), force: bool = False, resume_anyway: bool = False):
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}")
        self.path = Path(path)
        self.kind, self.run = kind, run or {}
        self.rows: dict[str, dict] = {}
        self._fd = self._lock_fd = -1
        self.differences: list[str] = []  # what differed from the rows resumed (resume_anyway)
        files.check_target(self.path, inputs=inputs)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._lock()
        try:
            if force and self.path.exists():
                files.replace_whole(self.path, b"")
            self._recover(resume_anyway)
            self._fd = files.open_append(self.path)
        except BaseException:
            self._unlock()
            raise

    def _lock(self) -> int:
        fd = files.open_side(self.path.with_name(self.path.name + ".lock"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise OutputLocked(f"{self.path}: is being written by {holder}; wait for it to finish or choose "
                               "another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({' '.join(sys.argv[:3])}) since {time.strftime('%H:%M:%S')}".encode(), 0)
        return fd

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = -1

    def _recover(self, resume_anyway: bool) -> None:
        raw = self.path.read_bytes() if self.path.exists() else b""
        body = raw if raw.endswith(b"\n") or not raw else raw[: raw.rfind(b"\n") + 1] + _tail(raw)
        found = read_jsonl(self.path) if raw.strip() else None
        rows = [row for _, row in found.rows] if found else []
        last = raw.count(b"\n") + (not raw.endswith(b"\n"))
        broken = [e for e in (found.errors if found else []) if e.line != last]  # a torn last line is a kill's
        if broken:
            raise OutputRefused(f"{broken[0]}; the file is damaged before its last line, so it is not resumed "
                                "(repair it, or pass --force to replace it)")
        if raw.strip() and not rows:
            raise OutputRefused(f"{self.path}: exists and holds no {self.kind} rows; pass --force to replace it")
        mismatched: set[str] = set()
        for row in rows:
            block = row.get("cg_dspy") if isinstance(row.get("cg_dspy"), dict) else {}
            if block.get("kind") != self.kind:
                what = f"{block['kind']} rows" if block.get("kind") else "rows this project did not write"
                raise OutputRefused(f"{self.path}: holds {what}, not {self.kind}; pass --force to replace it")
            diff = differences(self.run, block.get("run") or {})
            if diff:
                mismatched.update(diff)
            rid = row_id(row)
            if rid is not None and not row.get("error"):
                self.rows[rid] = row
        if mismatched and not resume_anyway:
            raise OutputRefused(f"{self.path}: was written by other settings ({'; '.join(sorted(mismatched))}); "
                                "pass --force to start it anew or --resume-anyway to keep its rows")
        self.differences = sorted(mismatched)
        clean = b"".join(_encode(r) for r in self.rows.values())
        if clean != body or body != raw:
            files.replace_whole(self.path, clean)

    def discard(self, ids) -> None:
        """Forget finished rows (their input changed), so they are done again."""
        ids = set(ids) & set(self.rows)
        if not ids:
            return
        for rid in ids:
            del self.rows[rid]
        os.close(self._fd)
        files.replace_whole(self.path, b"".join(_encode(r) for r in self.rows.values()))
        self._fd = files.open_append(self.path)

    def done(self) -> set[str]:
        return set(self.rows)

    def append(self, row: dict) -> None:
        """Write one row as one line, stamped with this store's kind and run; safe from
        many threads at once."""
        row["cg_dspy"] = {**(row.get("cg_dspy") or {}), "kind": self.kind, "run": self.run}
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
        self._unlock()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tail(raw: bytes) -> bytes:
    """A last line without its newline: kept when it is a whole row, cut when torn."""
    last = raw[raw.rfind(b"\n") + 1:]
    try:
        json.loads(last)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return b""
    return last + b"\n"


def _encode(row: dict) -> bytes:
    return (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")


__all__ = ["KINDS", "OutputLocked", "OutputRefused", "ResultStore", "differences", "read_rows", "row_id"]
