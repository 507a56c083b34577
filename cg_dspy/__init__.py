"""cg_dspy: ContextGuard, structured self-auditing for context learning, in DSPy."""

import os

# Offline and quiet by default: LiteLLM's bundled cost map instead of a download,
# and no usage telemetry from the libraries we load.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

from cg_dspy.baselines import Baseline, SelfRefine  # noqa: E402
from cg_dspy.program import ContextGuard  # noqa: E402

__all__ = ["Baseline", "ContextGuard", "SelfRefine"]
