"""The paper's method: ContextGuard (Algorithm 1), its stages and the baselines.

Nothing here reads files, talks to MLflow or grades answers: the method only calls the
LM it is given (through `dspy.context`).
"""

from __future__ import annotations

import dspy

from cg_dspy.method.baselines import Baseline, SelfRefine
from cg_dspy.method.program import ABLATIONS, LAYOUTS, ContextGuard

METHODS = ("baseline", "self-refine", "contextguard")


def method_names() -> list[str]:
    """Every method `bench` knows: the three methods and each single ablation."""
    return [*METHODS, *(f"contextguard-no-{a}" for a in ABLATIONS)]


def build_program(method: str, ablate: tuple[str, ...] | list[str] = (), max_rounds: int = 1,
                  layout: str = "chat", **options) -> dspy.Module:
    """The module for a method name; `contextguard-no-X` is ContextGuard with X ablated.
    `options` (min_length_ratio, policy) go to ContextGuard."""
    if method == "baseline":
        return Baseline()
    if method == "self-refine":
        return SelfRefine(layout=layout)
    if method == "contextguard":
        return ContextGuard(ablate=ablate, max_rounds=max_rounds, layout=layout, **options)
    if method.startswith("contextguard-no-"):
        return ContextGuard(ablate=(*ablate, method.removeprefix("contextguard-no-")), max_rounds=max_rounds,
                            layout=layout, **options)
    raise ValueError(f"unknown method {method!r}; choose from {method_names()}")


__all__ = ["ABLATIONS", "LAYOUTS", "METHODS", "Baseline", "ContextGuard", "SelfRefine", "build_program", "method_names"]
