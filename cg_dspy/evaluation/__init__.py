"""Old import paths, kept so code written against them keeps working.

CL-bench's runs and grading moved to `cg_dspy.clbench`, the judge to `cg_dspy.judge`,
`bench` to `cg_dspy.workflows.bench`. `import cg_dspy.evaluation.data` (and the others
below) hands back the module at its new place: the same objects, not copies. New code
imports the new paths; nothing in the project imports this package.
"""

from __future__ import annotations

import importlib
import sys

MOVED = {"data": "cg_dspy.clbench.data", "rows": "cg_dspy.clbench.rows", "store": "cg_dspy.clbench.store",
         "runner": "cg_dspy.clbench.runner", "harness": "cg_dspy.clbench.generation",
         "judge": "cg_dspy.clbench.grading", "metric": "cg_dspy.judge.metric",
         "rubric_types": "cg_dspy.judge.typer", "bench": "cg_dspy.workflows.bench"}

for _old, _new in MOVED.items():
    # Registered before the import system looks for the submodule, so it finds these.
    sys.modules[f"{__name__}.{_old}"] = module = importlib.import_module(_new)
    globals()[_old] = module
