import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
SHARED = ROOT.parent / "shared" / "clbench"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Each test starts with DSPy's caches empty (so call counts mean what they say) and
    writes its MLflow store, DSPy disk cache and any relative paths under tmp_path,
    subprocesses included."""
    import dspy

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    monkeypatch.setenv("DSPY_CACHEDIR", str(tmp_path / "dspy-cache"))
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    dspy.cache.reset_memory_cache()
    yield
    # MLflow's DSPy loader configures its model's LM globally; no test inherits another's.
    dspy.settings.configure(lm=None, adapter=None)


@pytest.fixture
def tasks():
    from cg_dspy.evaluation.data import load_tasks

    return {t.idx: t for t in load_tasks(DATA / "tasks.jsonl").tasks}


def shared_file(name: str) -> Path:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def cli(*args, env=None, timeout=180):
    """`contextguard ARGS` in a subprocess, as a user runs it."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})}
    return subprocess.run([sys.executable, "-m", "cg_dspy.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh MLflow sqlite store (experiment cg-test), the working directory beside it."""
    from cg_dspy import tracking

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking.setup(uri, "cg-test")
    return uri
