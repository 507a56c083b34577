"""cg_dspy: ContextGuard, structured self-auditing for context learning, in DSPy.

    from cg_dspy import ContextGuard, load_program

The method lives in `cg_dspy.method`, LMs and adapters in `cg_dspy.lms`, the judge in
`cg_dspy.judge`, CL-bench runs and grading in `cg_dspy.clbench`, the paper's tables and
figures in `cg_dspy.reports`, prompt optimization in `cg_dspy.optimize`, MLflow in
`cg_dspy.tracking`, and each command as a tracked library call in `cg_dspy.workflows`.
Importing the package changes nothing in the process (no environment variables, no DSPy
patches): the `contextguard` command does that. The names below load on first use, so a
helper process (the trace writer) that needs none of them does not pay for DSPy.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"Baseline": "cg_dspy.method", "ContextGuard": "cg_dspy.method", "SelfRefine": "cg_dspy.method",
            "load_program": "cg_dspy.saved", "rubric_scorer": "cg_dspy.tracking.scorer"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cg_dspy' has no attribute {name!r}")
