"""Reading a run's artifact, and nothing a registry entry could point elsewhere.

A prompt version's tags, a model version and a run all come from a store other people
can write to. So whatever they name is resolved here, inside the tracking store the
user chose, and nowhere else:

- only `runs:/<run id>/<path>` of a run this store holds is read; the path is relative
  and fixed by the caller (`program.json`, `prompts/<stage>.demos.json`), never taken
  from a tag, and a tag that names anything else is refused, naming the tag;
- the run's artifacts are read where the store keeps them: a local folder (no link
  leading out of it, a regular file only), the tracking server itself
  (`mlflow-artifacts:`), or the object store the deployment configured; an HTTP
  artifact root on another host than the tracking server is refused, because MLflow
  would send the tracking credentials there;
- every artifact is size-checked before it is fetched and read with a limit.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
import tempfile
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from cg_dspy.tracking.store import mlflow

MAX_ARTIFACT_BYTES = 64 * 2**20  # a program or a stage's demos; more is not a program of ours
RUN_ID = re.compile(r"[0-9a-f]{32}")
_PATH = re.compile(r"[\w.\-]+(?:/[\w.\-]+)*")


class ArtifactRefused(ValueError):
    """An artifact that is not read: outside the store, too large, or not a file."""


def read_run_json(run_id: str, path: str, *, what: str):
    """The JSON value of artifact `path` of run `run_id` in this store (None when the run
    has no such artifact); `what` names the source in every error."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if not RUN_ID.fullmatch(run_id or ""):
        raise ArtifactRefused(f"{what}: {run_id!r} is not an MLflow run id")
    if not _PATH.fullmatch(path) or ".." in path.split("/"):
        raise ArtifactRefused(f"{what}: {path!r} is not a path inside a run's artifacts")
    client = MlflowClient()
    try:
        root = client.get_run(run_id).info.artifact_uri
    except MlflowException:
        raise ValueError(f"{what}: no run {run_id} in the MLflow store {mlflow().get_tracking_uri()} (pass "
                         "--tracking-uri or set MLFLOW_TRACKING_URI)") from None
    where = urlparse(root)
    if where.scheme in ("", "file"):
        return _read_local(Path(url2pathname(where.path) if where.scheme else root), path, what)
    tracking = urlparse(mlflow().get_tracking_uri())
    if where.scheme in ("http", "https", "mlflow-artifacts") and where.netloc and where.netloc != tracking.netloc:
        raise ArtifactRefused(f"{what}: run {run_id} keeps its artifacts at {where.scheme}://{where.netloc}, not on "
                              "the tracking server; not fetched (the tracking credentials would go there)")
    listed = {f.path: f for f in client.list_artifacts(run_id, posixpath.dirname(path) or None)}
    entry = listed.get(path)
    if entry is None or entry.is_dir:
        return None
    if entry.file_size is None or entry.file_size > MAX_ARTIFACT_BYTES:
        raise ArtifactRefused(f"{what}: {path} of run {run_id} is {entry.file_size} bytes; at most "
                              f"{MAX_ARTIFACT_BYTES} are read")
    with tempfile.TemporaryDirectory() as tmp:
        return _json(Path(client.download_artifacts(run_id, path, tmp)), what)


def _read_local(root: Path, path: str, what: str):
    base = root.resolve()
    try:
        real = (base / path).resolve(strict=True)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not real.is_relative_to(base):
        raise ArtifactRefused(f"{what}: {path} leads out of the run's artifact folder; not read")
    if not stat.S_ISREG(os.stat(real).st_mode):
        raise ArtifactRefused(f"{what}: {path} is not a regular file; not read")
    return _json(real, what)


def _json(path: Path, what: str):
    with open(path, "rb") as f:
        data = f.read(MAX_ARTIFACT_BYTES + 1)
    if len(data) > MAX_ARTIFACT_BYTES:
        raise ArtifactRefused(f"{what}: larger than {MAX_ARTIFACT_BYTES} bytes; not read")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{what}: not JSON ({exc})") from None
