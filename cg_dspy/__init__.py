"""cg_dspy: ContextGuard, structured self-auditing for context learning, in DSPy.

    from cg_dspy import ContextGuard, load_program

The method lives in `cg_dspy.method`, LMs and adapters in `cg_dspy.lms`, CL-bench runs
and grading in `cg_dspy.evaluation`, the paper's tables and figures in
`cg_dspy.reports`, prompt optimization in `cg_dspy.optimize`, MLflow in
`cg_dspy.tracking`. Importing the package changes nothing in the process (no
environment variables, no DSPy patches): the `contextguard` command does that.
"""

from cg_dspy.method import Baseline, ContextGuard, SelfRefine
from cg_dspy.saved import load_program

__all__ = ["Baseline", "ContextGuard", "SelfRefine", "load_program"]
