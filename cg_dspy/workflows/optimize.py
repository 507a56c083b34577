"""`optimize` as one tracked workflow: the compile (cg_dspy.optimize, no MLflow inside)
inside one MLflow run with DSPy's own traces of each program call (unless tracing is
off), the splits as run
inputs, each candidate's dev score as a step, and afterwards the scores, call counts,
GEPA's candidates, the Prompt Registry versions and the logged model."""

from __future__ import annotations

import contextlib
import json

from cg_dspy import tracking
from cg_dspy.method.config import ProgramConfig
from cg_dspy.optimize import compile as compiling
from cg_dspy.optimize.compile import OptimizeResult
from cg_dspy.workflows import Tracking

# What the logged model's signature is read from: a made-up task, no benchmark data.
INPUT_EXAMPLE = {"conversation": [{"role": "system", "content": "Answer in exactly one bullet point."},
                                  {"role": "user", "content": "Name the planet closest to the sun."}],
                 "category": "Domain Knowledge Reasoning"}


def optimize(*, settings: Tracking = Tracking(), alias: str | None = None, **options) -> OptimizeResult:
    """`cg_dspy.optimize.compile.optimize(**options)`, tracked as one MLflow run (unless
    `settings.enabled` is off); `alias` names the run's prompt versions in the registry."""
    plan = compiling.prepare(**options)
    if not settings.enabled:
        return plan.run()
    tracking.setup(settings.uri, settings.experiment)
    params = options.get("params") or {}
    name = f"optimize-{options['optimizer']}-{plan.budget}"
    # `trace=False` (--no-trace) also keeps DSPy's autolog traces out: hundreds per compile.
    with tracking.run(name, kind="optimize", params=plan.settings) as active, \
            (tracking.autolog() if settings.trace else contextlib.nullcontext()), \
            tracking.tracing(settings.trace, inline=True):
        for split in ("train", "dev", "test"):
            if options.get(split):
                tracking.log_split(split, options[split], source=str(params.get(split) or split))
        plan.on_candidate = lambda c: tracking.log_step(active.info.run_id, "candidate.dev_rubric_pass_rate",
                                                        100 * c.score, c.index)
        result = plan.run()
        result.run_id = active.info.run_id
        base = ProgramConfig.load(result.program.config(), "the optimized program").build()  # the same, untuned
        _log(result, active.info.run_id, optimizer=options["optimizer"], budget=plan.budget,
             tunable=plan.tunable, alias=alias, base=base)
    return result


def _log(result: OptimizeResult, run_id: str, *, optimizer, budget, tunable, alias, base) -> None:
    """The run's scores, counts, candidates, prompt versions and model."""
    before, after = result.dev_before, result.dev_after
    for label, scores in (("dev_before", before), ("dev", after)):
        if scores:
            tracking.log_summary(scores, prefix=f"{label}.")
    tracking.log_metrics({**{f"calls.{k}": v for k, v in result.calls.items()},
                          **{f"estimate.{k}": v for k, v in ((result.estimate or {}).get("calls") or {}).items()},
                          "capped": int(result.capped)})
    if result.gepa:
        tracking.log_dict(result.gepa, "gepa/candidates.json")
    change = result.dev_change if before and after else None
    tags = {"optimizer": optimizer, "budget": budget, "capped": str(result.capped).lower()}
    message = f"{optimizer} ({budget})" + (" [capped]" if result.capped else "")
    if change:
        tracking.log_comparison(change, prefix="dev_change.")
        message += (f": dev task-solving rate {before['task_solving_rate']} -> {after['task_solving_rate']} "
                    f"(Δ {change['delta_task_solving_rate']:+.2f} points, 95% CI "
                    f"{change['delta_task_solving_rate_ci95']}, McNemar p {change['mcnemar_p']:.3g}, "
                    f"{len(after['per_task'])} tasks), rubric pass rate {before['rubric_pass_rate']} -> "
                    f"{after['rubric_pass_rate']}")
        tags.update({"dev_before_tsr": before["task_solving_rate"], "dev_tsr": after["task_solving_rate"],
                     "dev_tsr_ci95": json.dumps(after["task_solving_rate_ci95"]), "dev_tasks": len(after["per_task"]),
                     "dev_delta_tsr": change["delta_task_solving_rate"],
                     "dev_delta_tsr_ci95": json.dumps(change["delta_task_solving_rate_ci95"]),
                     "dev_mcnemar_p": change["mcnemar_p"], "dev_before_rubric_pass": before["rubric_pass_rate"],
                     "dev_rubric_pass": after["rubric_pass_rate"]})
    if result.test and result.test.get("scored"):
        test = result.test["change"]
        tracking.log_summary(result.test["before"], prefix="test_before.")
        tracking.log_summary(result.test["after"], prefix="test.")
        tracking.log_comparison(test, prefix="test_change.")
        message += (f"; held-out test {result.test['before']['task_solving_rate']} -> "
                    f"{result.test['after']['task_solving_rate']} (Δ {test['delta_task_solving_rate']:+.2f}, "
                    f"95% CI {test['delta_task_solving_rate_ci95']}, McNemar p {test['mcnemar_p']:.3g})")
        tags.update({"test_tsr": result.test["after"]["task_solving_rate"],
                     "test_delta_tsr": test["delta_task_solving_rate"],
                     "test_delta_tsr_ci95": json.dumps(test["delta_task_solving_rate_ci95"]),
                     "test_mcnemar_p": test["mcnemar_p"], "test_tasks": result.test["tasks"]})
    versions = tracking.register_prompts(result.program, base, tuned=tuple(tunable), run_id=run_id, message=message,
                                         tags=tags, alias=alias)
    tracking.log_program(result.program, versions=versions, example=INPUT_EXAMPLE)
