"""The paper's method: ContextGuard (Algorithm 1), its stages and the baselines, and one
configuration (`config`) that saves and rebuilds any of them.

Nothing here reads files, talks to MLflow or grades answers: the method only calls the
LM it is given (through `dspy.context`).
"""

from __future__ import annotations

from cg_dspy.method.baselines import Baseline, SelfRefine
from cg_dspy.method.config import METHODS, ProgramConfig, build_program, method_names
from cg_dspy.method.program import ABLATIONS, LAYOUTS, ContextGuard

__all__ = ["ABLATIONS", "LAYOUTS", "METHODS", "Baseline", "ContextGuard", "ProgramConfig", "SelfRefine",
           "build_program", "method_names"]
