"""Append-only JSONL result files that survive being killed, and that belong to one run.

Each finished task is one line written with a single `os.write` on an O_APPEND file
descriptor, so concurrent workers never interleave and a SIGKILL leaves at most a torn
last line. Opening a store repairs that: the torn tail is cut, failed rows and
duplicates are dropped (atomically, through a temporary file and `os.replace`), and
the ids already finished are skipped by the caller.

A store is also careful about what it writes over:
- `--out` must not be a directory or one of the run's inputs (the same file by path or
  inode);
- an existing file must be one this project wrote for the same kind of output
  (every row carries a `cg_dspy` block: kind, what produced it, and a digest of the
  task's input) unless `force`, which starts it anew;
- rows written by different settings refuse the resume (the differences are named)
  unless `resume_anyway`; a row whose task input changed is done again;
- one writer at a time: an advisory lock (`OUT.lock`, fcntl) is held while the store is
  open; a second process is told who holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from cg_dspy.evaluation.rows import read_jsonl

KINDS = ("results", "graded")


class OutputRefused(ValueError):
    """The output path is not one this run may write."""


class OutputLocked(OutputRefused):
    """Another process is writing the same output."""


def replace_file(path: str | os.PathLike, data: bytes) -> None:
    """Write `path` whole or not at all: a fresh temporary file beside it (never one that
    was there, never through a planted link), then renamed over it."""
    import tempfile

    path = Path(path)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def refuse_unless_ours(path: str | os.PathLike, marker: bytes, what: str) -> None:
    """An existing output is replaced only if it carries our marker (near its start)."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise OutputRefused(f"{path}: exists and is not a file this command wrote; not overwritten")
    if path.exists():
        with path.open("rb") as f:
            if marker not in f.read(8192):
                raise OutputRefused(f"{path}: exists and is not {what}; not overwritten")


def row_id(row: dict) -> str | None:
    """A row's task id: `idx`, else the metadata's `task_id`."""
    if row.get("idx") is not None:
        return str(row["idx"])
    meta = row.get("metadata") or {}
    return str(meta["task_id"]) if isinstance(meta, dict) and meta.get("task_id") is not None else None


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


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


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
        if self.path.is_dir():
            raise OutputRefused(f"{self.path}: is a directory; --out names a file")
        for source in inputs:
            if source is not None and _same_file(self.path, Path(source)):
                raise OutputRefused(f"{self.path}: is also an input of this run; write the output elsewhere")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_fd = self._lock()
        try:
            if force and self.path.exists():
                self.path.write_bytes(b"")
            self._recover(resume_anyway)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except BaseException:
            self._unlock()
            raise

    def _lock(self) -> int:
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
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
            tmp = self.path.with_suffix(self.path.suffix + ".tmp")
            tmp.write_bytes(clean)
            os.replace(tmp, self.path)

    def discard(self, ids) -> None:
        """Forget finished rows (their input changed), so they are done again."""
        ids = set(ids) & set(self.rows)
        if not ids:
            return
        for rid in ids:
            del self.rows[rid]
        os.close(self._fd)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_bytes(b"".join(_encode(r) for r in self.rows.values()))
        os.replace(tmp, self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

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
