"""Which MLflow store runs go to, checked once and quickly.

Runs go to a named experiment in an embedded SQLite store (`sqlite:///mlflow.db` in
the working directory) unless `--tracking-uri` or `MLFLOW_TRACKING_URI` says
otherwise. A tracking server that does not answer is a clear error at once, not four
minutes of MLflow's retries and an "internal error".
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_EXPERIMENT = "contextguard"
KIND_TAG = "cg_dspy.kind"
PROBE_SECONDS = 5.0


class StoreUnreachable(ValueError):
    """The tracking server named does not answer."""


def mlflow():
    import mlflow

    return mlflow


def tracking_uri(explicit: str | None = None) -> str:
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def setup(uri: str | None = None, experiment: str = DEFAULT_EXPERIMENT, *, create: bool = True) -> str:
    """Point MLflow at the store and experiment; returns the tracking URI used. With
    `create=False` (commands that only read) a local store must already exist."""
    uri = tracking_uri(uri)
    if not create:
        local = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else \
            uri.removeprefix("file://") if uri.startswith("file://") else None
        if local is not None and not Path(local).exists():
            raise FileNotFoundError(f"no MLflow store at {uri} (pass --tracking-uri or set MLFLOW_TRACKING_URI)")
    probe(uri)
    mlflow().set_tracking_uri(uri)
    if create:
        mlflow().set_experiment(experiment)
    return uri


def probe(uri: str) -> None:
    """A tracking server answers within seconds, or StoreUnreachable says so (any HTTP
    status is an answer; no credentials are sent)."""
    if urlparse(uri).scheme not in ("http", "https"):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=PROBE_SECONDS).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StoreUnreachable(f"the MLflow tracking server at {uri} does not answer ({reason}); start it, fix "
                               "--tracking-uri / MLFLOW_TRACKING_URI, or pass --no-track") from None
