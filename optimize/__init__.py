"""Prompt optimization of ContextGuard's stages with DSPy optimizers (see `compile`)."""

from optimize.compile import OptimizeResult, evaluate, optimize
from optimize.recipes import BUDGETS, RECIPES

__all__ = ["BUDGETS", "RECIPES", "OptimizeResult", "evaluate", "optimize"]
