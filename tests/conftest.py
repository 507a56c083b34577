import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"
SHARED = ROOT.parent / "shared" / "clbench"

# The modules that take longest, started first: pytest-xdist (`--dist loadfile`: a
# module's tests on one worker, so its module fixtures are made once) hands out modules
# in collection order, and a three-minute module started last is a tail the other worker
# waits through. Within a module the order is unchanged.
LONGEST_FIRST = ("test_real_server.py", "test_round3_tracing.py", "test_optimize_scale.py", "test_round3.py",
                 "test_mlflow.py", "test_optimize.py", "test_faults.py", "test_cli.py", "test_statistics.py")


def pytest_configure(config):
    _new_stores_from_a_template()


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` is one worker more than there are cores: many tests spend part of their
    time waiting (on a signalled command, a slowed test server, the llama.cpp server's
    replies), and the extra worker runs while they wait. xdist's own variable still
    overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    from xdist.plugin import pytest_xdist_auto_num_workers as cores

    return cores(config) + 1


def _new_stores_from_a_template():
    """A new MLflow sqlite store is a copy of one MLflow migrated at the start of the
    session, not a fresh migration: the same tables, rows and schema revision (MLflow
    verifies it on every open), without the second of CPU a migration costs, which a
    suite that opens some two hundred stores paid for minutes. In this process only; a
    command started as a real process migrates its own store as a user's does."""
    import sqlite3
    import tempfile
    import threading

    import mlflow.store.db.utils as db_utils
    import mlflow.store.model_registry.sqlalchemy_store as registry_store
    import sqlalchemy

    migrate, lock, template = db_utils._initialize_tables, threading.Lock(), []

    def initialize(engine):
        if engine.url.get_backend_name() != "sqlite" or engine.url.database in (None, "", ":memory:"):
            return migrate(engine)
        with lock:
            if not template:
                template.append(Path(tempfile.mkdtemp(prefix="mlflow-template-")) / "mlflow.db")
                migrate(sqlalchemy.create_engine(f"sqlite:///{template[0]}"))
            source, target = sqlite3.connect(template[0]), engine.raw_connection()
            try:
                source.backup(target.driver_connection)
            finally:
                target.close()
                source.close()

    db_utils._initialize_tables = registry_store._initialize_tables = initialize


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))


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
    dspy.settings.configure(lm=None, adapter=None, callbacks=[])


@pytest.fixture
def tasks():
    from cg_dspy.clbench.data import load_tasks

    return {t.idx: t for t in load_tasks(DATA / "tasks.jsonl").tasks}


def shared_file(name: str) -> Path:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


@dataclass
class Completed:
    """What a command left: its exit status and everything it printed."""

    returncode: int
    stdout: str
    stderr: str


def cli(*args, env=None):
    """`contextguard ARGS` as a user runs it: the command's own `main`, its stdout, stderr
    and exit status (argparse's exit included), with `env` set for the call. In this
    process, so the suite pays for imports once; tests that signal, kill or time a
    command start a real process (`spawn`)."""
    from cg_dspy.cli import main

    out, err = io.StringIO(), io.StringIO()
    before = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return Completed(code, out.getvalue(), err.getvalue())


def spawn(*args, env=None):
    """`contextguard ARGS` as a real process (to signal, kill or watch it)."""
    return subprocess.Popen([sys.executable, "-m", "cg_dspy.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A fresh MLflow sqlite store (experiment cg-test), the working directory beside it."""
    from cg_dspy import tracking

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tracking.setup(uri, "cg-test")
    return uri


def tracked_optimize(uri: str, *, trace: bool = False, **options):
    """The tracked optimize workflow into the store at `uri` (experiment cg-test), with one
    judge vote unless `dev_votes` says otherwise and no traces unless `trace`: tests about
    the registry, programs and runs are not about voting, and DSPy's autolog writes
    hundreds of traces per compile (one test checks them)."""
    from cg_dspy.workflows import Tracking
    from cg_dspy.workflows.optimize import optimize

    return optimize(settings=Tracking(uri=uri, experiment="cg-test", trace=trace), **{"dev_votes": 1, **options})


def untracked_optimize(**options):
    """The compile with no MLflow at all (`cg_dspy.optimize.compile.optimize`), one judge
    vote unless `dev_votes` says otherwise."""
    from cg_dspy.optimize.compile import optimize

    return optimize(**{"dev_votes": 1, **options})


def verdicts_on(trace) -> list:
    """A trace's per-requirement verdicts (the feedback named `requirement/<type>`), in
    rubric order."""
    mine = [a for a in trace.info.assessments if a.name.startswith("requirement/")]
    return sorted(mine, key=lambda a: int(a.metadata["cg_dspy.verdict"]))


def assessment(trace, name: str):
    """The one assessment named `name` on a trace."""
    (found,) = [a for a in trace.info.assessments if a.name == name]
    return found
