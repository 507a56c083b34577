"""Prompt optimization of ContextGuard's stages with DSPy optimizers (see `compile`)."""

from cg_dspy.optimize.compile import DEFAULT_TUNABLE, OptimizeResult, evaluate, optimize
from cg_dspy.optimize.recipes import BUDGETS, RECIPES

__all__ = ["BUDGETS", "DEFAULT_TUNABLE", "RECIPES", "OptimizeResult", "evaluate", "optimize"]
