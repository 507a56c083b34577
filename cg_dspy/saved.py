"""Saved programs: JSON state, loaded into a freshly built program.

`program.save("p.json")` (DSPy's own) writes every predictor's instruction and demos
plus a `cg_dspy` block that says how to rebuild the program (method, ablations,
rounds). `load_program` reads that file, or the same JSON from an MLflow run
(`runs:/<run_id>/program.json`), builds the program and loads the state. Nothing is
unpickled unless the caller passes `allow_pickle=True` for a pickled MLflow model.
"""

from __future__ import annotations

import json
from pathlib import Path

import dspy


def build_from_config(config: dict) -> dspy.Module:
    """A fresh, untuned program from a saved `cg_dspy` block."""
    from cg_dspy.categories import SpecialistPolicy
    from cg_dspy.harness import build_program

    options = {}
    if "min_length_ratio" in config:
        options["min_length_ratio"] = float(config["min_length_ratio"])
    if config.get("policy"):
        options["policy"] = {c: SpecialistPolicy(*p) for c, p in config["policy"].items()}
    return build_program(config.get("method", "contextguard"), tuple(config.get("ablate") or ()),
                         int(config.get("max_rounds", 1)), **options)


def program_from_state(state: dict) -> dspy.Module:
    """Build the program a state describes and load the state into it."""
    if not isinstance(state, dict):
        raise ValueError("a saved program must be a JSON object")
    program = build_from_config(state.get("cg_dspy") or {})
    program.load_state({k: v for k, v in state.items() if k not in ("cg_dspy", "metadata")})
    return program


def load_program(source: str | Path, *, allow_pickle: bool = False) -> dspy.Module:
    """A ready program from a saved JSON file or an MLflow URI (`runs:/ID[/program.json]`,
    `models:/...`). `allow_pickle=True` lets an MLflow model without JSON state be loaded
    with `mlflow.dspy.load_model`, which unpickles: only for files you trust."""
    text = str(source)
    if "://" not in text and ":/" not in text:
        path = Path(text)
        if path.suffix != ".json":
            raise ValueError(f"{path}: saved programs are JSON state files; refusing to load {path.suffix or 'it'}")
        return program_from_state(json.loads(path.read_text(encoding="utf-8")))
    from cg_dspy import tracking

    state = tracking.load_program_state(text)
    if state is not None:
        return program_from_state(state)
    if not allow_pickle:
        raise ValueError(f"{text} holds no {tracking.PROGRAM_ARTIFACT}; "
                         "pass allow_pickle=True to unpickle an MLflow model")
    return tracking.load_pickled_model(text)
