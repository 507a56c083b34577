"""Every MLflow call of the project, one concern per module:

- `store`: which store runs go to (checked quickly);
- `runs`: a command's run, its params and metrics, and how it ended;
- `traces` and `writer`: a trace per task, written by a separate process;
- `assessments`: a graded task's verdicts on its trace;
- `scorer`: the rubric judge as an MLflow scorer (`mlflow.genai.evaluate`);
- `datasets`: splits as MLflow evaluation datasets;
- `prompts`: the Prompt Registry (one prompt per stage, versions, aliases);
- `models`: the compiled program as JSON state and as one logged model;
- `artifacts`: the only way anything named by the registry is read.
"""

from cg_dspy.tracking.datasets import log_split, register_split
from cg_dspy.tracking.models import PROGRAM_ARTIFACT, load_program_state, log_program
from cg_dspy.tracking.prompts import load_prompt_state, register_prompts
from cg_dspy.tracking.runs import (
    autolog,
    log_artifacts,
    log_comparison,
    log_dict,
    log_endpoints,
    log_metrics,
    log_report,
    log_run_summary,
    log_step,
    log_summary,
    log_text,
    run,
)
from cg_dspy.tracking.store import DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI, KIND_TAG, StoreUnreachable, setup
from cg_dspy.tracking.traces import TraceReport, find_traces, trace_ids, tracing

__all__ = ["DEFAULT_EXPERIMENT", "DEFAULT_TRACKING_URI", "KIND_TAG", "PROGRAM_ARTIFACT", "StoreUnreachable",
           "TraceReport", "autolog", "find_traces", "load_program_state", "load_prompt_state", "log_artifacts",
           "log_comparison", "log_dict", "log_endpoints", "log_metrics", "log_program", "log_report",
           "log_run_summary", "log_split", "log_step", "log_summary", "log_text", "register_prompts",
           "register_split", "run", "setup", "trace_ids", "tracing"]
