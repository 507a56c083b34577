"""Every file the project writes goes through here, so one set of rules holds for all
of them (results, graded files, side files, reports, figures, programs, manifests):

- a symbolic link is never followed and never replaced: it is refused, even with
  `--force` (a planted `OUT.lock` or `report.json` link would otherwise write into its
  target);
- anything that is not a regular file (a directory, a FIFO, a device) is refused;
- an existing file that is not ours (`Kind.owns`) is refused unless `force`, and so is
  a file that is also an input of the run;
- a whole file is written through a fresh temporary file beside it and renamed over
  the target, so a reader (or a crash) sees the old file or the new one, never half;
  it is created readable by others as the umask allows (a results folder is shared);
- side files (locks) and append-only files are opened without following links.

Checks come before any work: callers check every output first, then spend.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

HEAD_BYTES = 8192  # where a marker must appear
MAX_JSON_BYTES = 256 * 2**20  # a JSON file of ours larger than this is not read to check it


class OutputRefused(ValueError):
    """The output path is not one this run may write."""


class OutputLocked(OutputRefused):
    """Another process is writing the same output."""


@dataclass(frozen=True)
class Kind:
    """A kind of file this project writes: its name for messages, and how to tell one of
    ours (a marker in its first bytes, or a test of the parsed file)."""

    what: str
    marker: bytes | None = None
    test: Callable[[Path], bool] | None = None

    def owns(self, path: Path) -> bool:
        if self.marker is not None:
            with open(path, "rb") as f:
                if self.marker in f.read(HEAD_BYTES):
                    return True
        return self.test(path) if self.test is not None else False


def json_kind(what: str, test: Callable[[object], bool], marker: bytes | None = None) -> Kind:
    """A JSON file of ours: a marker near its start, else a test of its parsed value."""

    def parsed(path: Path) -> bool:
        if path.stat().st_size > MAX_JSON_BYTES:
            return False
        try:
            return bool(test(json.loads(path.read_bytes())))
        except (UnicodeDecodeError, ValueError):
            return False

    return Kind(what, marker, parsed)


def same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def check(path: str | os.PathLike, kind: Kind, *, force: bool = False, inputs: Iterable = ()) -> Path:
    """`path` if this run may write it, else OutputRefused naming why (before any work)."""
    path = check_target(path, inputs=inputs)
    if path.exists() and not force and not kind.owns(path):
        raise OutputRefused(f"{path}: exists and is not {kind.what}; not overwritten (pass --force to replace it)")
    return path


def check_target(path: str | os.PathLike, *, inputs: Iterable = ()) -> Path:
    """`path` unless it is a link, an input of the run, or something other than a
    regular file (whether the file is ours is the caller's `Kind`)."""
    path = Path(path)
    if path.is_symlink():
        raise OutputRefused(f"{path}: is a symbolic link; links are never written through (remove it or choose "
                            "another path)")
    for source in inputs:
        if source is not None and same_file(path, Path(source)):
            raise OutputRefused(f"{path}: is also an input of this run; write the output elsewhere")
    if not path.exists():
        return path
    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        raise OutputRefused(f"{path}: is a directory; it names a file")
    if not stat.S_ISREG(mode):
        raise OutputRefused(f"{path}: is not a regular file; not overwritten")
    return path


def write(path: str | os.PathLike, data: bytes, kind: Kind, *, force: bool = False, inputs: Iterable = ()) -> Path:
    """Check `path` (see `check`), then replace it whole with `data`."""
    path = check(path, kind, force=force, inputs=inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_whole(path, data)
    return path


def replace_whole(path: str | os.PathLike, data: bytes) -> None:
    """Write `path` whole or not at all: a fresh temporary file beside it (never one that
    was there, never through a planted link), then renamed over it (a link at `path`
    is replaced by the file, its target untouched)."""
    path = Path(path)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        os.fchmod(fd, shared_mode())
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


_UMASK: int | None = None


def shared_mode() -> int:
    """0o644 under the process's umask: what `open()` would have created."""
    global _UMASK
    if _UMASK is None:
        current = os.umask(0o022)
        os.umask(current)
        _UMASK = current
    return 0o666 & ~_UMASK & ~0o111


def open_append(path: str | os.PathLike) -> int:
    """A descriptor appending to `path` (created if missing), never through a link."""
    return _open(Path(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def open_side(path: str | os.PathLike) -> int:
    """A side file (a lock) opened for reading and writing, never through a link, and
    never a file with other names (a hard link planted to a file elsewhere)."""
    path = Path(path)
    fd = _open(path, os.O_RDWR | os.O_CREAT)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise OutputRefused(f"{path}: is not a plain file of this project's (a link or a special file); remove it")
    return fd


def _open(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, shared_mode())
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputRefused(f"{path}: is a symbolic link; links are never written through (remove it)") from None
        raise


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block has written its files (main thread only;
    elsewhere the block simply runs): a set of files is replaced all or not at all."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])
