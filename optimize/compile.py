"""The compile entry point: a program, a train and a dev split, an optimizer recipe.

By default only the audit predictors (the generic one and each integrated specialist's)
and the revision are tuned (`tunable`); the others are hidden from the optimizer and
keep their instructions. The dev split is scored
before and after with the rubric metric (dense pass rate and strict task-solving
rate); everything is logged as one MLflow run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import dspy

from cg_dspy import tracking
from cg_dspy.evaluation.data import to_example
from cg_dspy.evaluation.metric import RubricMetric
from cg_dspy.lms import patches, using
from cg_dspy.method import build_program
from cg_dspy.method.specialists import integrated_audits
from cg_dspy.optimize.recipes import RECIPES, compile_with
from cg_dspy.reports import analysis, statistics
from cg_dspy.saved import check_output, save_program

# What the logged model's signature is read from: a made-up task, no benchmark data.
INPUT_EXAMPLE = {"conversation": [{"role": "system", "content": "Answer in exactly one bullet point."},
                                  {"role": "user", "content": "Name the planet closest to the sun."}],
                 "category": "Domain Knowledge Reasoning"}

# The audit (generic, and each integrated specialist's own, as the default policy runs
# them) and the revision: the prompts the paper's method turns on.
DEFAULT_TUNABLE = ("audit", *integrated_audits(), "revise")


@dataclass
class OptimizeResult:
    """The compiled program, its dev scores before and after (each task's outcome in
    `per_task`), and the paired change between them (`dev_change`)."""

    program: dspy.Module
    dev_before: dict
    dev_after: dict
    settings: dict
    run_id: str | None = None
    judge_calls: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def dev_change(self) -> dict:
        return paired_dev(self.dev_before, self.dev_after)


class DevFailed(RuntimeError):
    """Every dev task failed before compiling (the task LM or the judge answers nothing), so
    nothing can be tuned: an optimizer would only spend its budget on errors and register
    untouched prompts."""


def evaluate(program, examples, metric: RubricMetric, *, lm, threads: int = 4) -> dict:
    """Dense rubric pass rate and strict task-solving rate (overall, per category), in %, and
    how many tasks failed with an error (scored 0 by DSPy, so counted here to be seen)."""
    errors: list[str] = []

    def answered(**inputs):
        try:
            return program(**inputs)
        except Exception as exc:  # the task LM did not answer
            errors.append(f"{type(exc).__name__}: {exc}")
            raise

    def judged(example, prediction, trace=None):
        try:
            return metric(example, prediction, trace)
        except Exception as exc:  # the judge did not answer: 0, counted (raising here makes
            errors.append(f"{type(exc).__name__}: {exc}")  # MLflow's autolog hand DSPy a None score)
            return 0.0

    with using(lm):
        result = dspy.Evaluate(devset=examples, metric=judged, num_threads=threads, display_progress=False,
                               provide_traceback=False, max_errors=len(examples) + 1)(answered)
    per_cat: dict[str, list[bool]] = defaultdict(list)
    fractions: dict[str, float] = {}
    for example, _pred, score in result.results:
        fractions[example.task_id] = float(getattr(score, "score", score) or 0.0)
        per_cat[example.category].append(fractions[example.task_id] == 1.0)
    solved = {tid: f == 1.0 for tid, f in fractions.items()}
    return {
        **analysis.rate_cell(sum(solved.values()), len(solved)),
        "rubric_pass_rate": round(100 * sum(fractions.values()) / max(1, len(fractions)), 2),
        "rubric_pass_rate_ci95": statistics.bootstrap_mean_ci(list(fractions.values())),
        "by_category": {c: analysis.rate_cell(sum(v), len(v)) for c, v in per_cat.items()},
        "errors": len(errors),
        **({"first_error": errors[0][:300]} if errors else {}),
        "per_task": {tid: {"solved": solved[tid], "pass_fraction": round(f, 4)} for tid, f in fractions.items()},
    }


def paired_dev(before: dict, after: dict) -> dict:
    """The tuned program against the untuned one on the same dev tasks: the difference of
    task-solving rates with its paired interval and McNemar p, and of rubric pass rates
    with a paired bootstrap interval."""
    common = sorted(set(before["per_task"]) & set(after["per_task"]))
    pairs = [(before["per_task"][t]["solved"], after["per_task"][t]["solved"]) for t in common]
    deltas = [after["per_task"][t]["pass_fraction"] - before["per_task"][t]["pass_fraction"] for t in common]
    out = {k: v for k, v in analysis.paired_rates(pairs).items()}
    out.update(delta_rubric_pass_rate=round(100 * sum(deltas) / max(1, len(deltas)), 2),
               delta_rubric_pass_rate_ci95=statistics.bootstrap_mean_ci(deltas))
    return out


def optimize(
    *,
    optimizer: str,
    train,
    dev,
    task_lm,
    judge_lm,
    reflection_lm=None,
    budget: str = "light",
    method: str = "contextguard",
    ablate: tuple[str, ...] = (),
    tunable: tuple[str, ...] = DEFAULT_TUNABLE,
    layout: str = "chat",
    threads: int = 4,
    out: str | Path | None = None,
    track: bool = True,
    trace: bool = True,
    alias: str | None = None,
    params: dict | None = None,
    force: bool = False,
    inputs: tuple = (),
) -> OptimizeResult:
    """Compile `method` with `optimizer` on `train`, score `dev` before and after."""
    patches.install()
    if optimizer not in RECIPES:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {sorted(RECIPES)}")
    if out:
        check_output(out, force=force, inputs=inputs)  # before any LM call
    program = build_program(method, ablate, layout=layout)
    names = [n for n, _ in program.named_predictors()]
    unknown = set(tunable) - set(names)
    if unknown:
        raise ValueError(f"tunable stages {sorted(unknown)} do not exist; the program has {names}")
    trainset, devset = [to_example(t) for t in train], [to_example(t) for t in dev]
    metric = RubricMetric(judge_lm)
    feedback_metric = RubricMetric(judge_lm, feedback=True, memo=metric.memo)
    recipe, settings = RECIPES[optimizer](
        feedback_metric if optimizer == "gepa" else metric, budget, threads=threads,
        reflection_lm=reflection_lm or task_lm, prompt_lm=reflection_lm or task_lm, task_lm=task_lm,
        train_size=len(trainset),
    )
    logged = {"optimizer": optimizer, "budget": budget, "optimizer_settings": settings, "method": method,
              "ablate": list(ablate), "tunable": list(tunable), "program": program.config(),
              "train_size": len(trainset), "dev_size": len(devset), **(params or {})}

    def work(run_id=None) -> OptimizeResult:
        before = evaluate(program, devset, metric, lm=task_lm, threads=threads)
        if devset and before["errors"] == len(devset):
            raise DevFailed(f"every dev task ({len(devset)}) failed before compiling, nothing was tuned; "
                            f"the first: {before['first_error']}")
        if hasattr(program, "frozen"):
            program.frozen = frozenset(set(names) - set(tunable))
        with using(task_lm):
            compiled = compile_with(optimizer, recipe, program, trainset, devset)
        if hasattr(compiled, "frozen"):
            compiled.frozen = frozenset()  # saved programs hold every stage
        after = evaluate(compiled, devset, metric, lm=task_lm, threads=threads)
        if out:
            save_program(compiled, out, force=force, inputs=inputs)
        return OptimizeResult(compiled, before, after, logged, run_id,
                              metric.judge_calls + feedback_metric.judge_calls)

    if not track:
        return work()
    with tracking.run(f"optimize-{optimizer}-{budget}", kind="optimize", params=logged) as active, \
            tracking.autolog(), tracking.tracing(trace, inline=True):
        for split, tasks in (("train", train), ("dev", dev)):
            tracking.log_split(split, tasks, source=str((params or {}).get(split) or split))
        result = work(active.info.run_id)
        for label, scores in (("dev_before", result.dev_before), ("dev", result.dev_after)):
            tracking.log_summary(scores, prefix=f"{label}.")
        before, after, change = result.dev_before, result.dev_after, result.dev_change
        tracking.log_comparison(change, prefix="dev_change.")
        message = (f"{optimizer} ({budget}): dev task-solving rate {before['task_solving_rate']} -> "
                   f"{after['task_solving_rate']} (Δ {change['delta_task_solving_rate']:+.2f} points, 95% CI "
                   f"{change['delta_task_solving_rate_ci95']}, McNemar p {change['mcnemar_p']:.3g}, "
                   f"{len(after['per_task'])} tasks), rubric pass rate {before['rubric_pass_rate']} -> "
                   f"{after['rubric_pass_rate']}")
        tags = {"optimizer": optimizer, "budget": budget, "dev_before_tsr": before["task_solving_rate"],
                "dev_tsr": after["task_solving_rate"], "dev_tsr_ci95": json.dumps(after["task_solving_rate_ci95"]),
                "dev_tasks": len(after["per_task"]), "dev_delta_tsr": change["delta_task_solving_rate"],
                "dev_delta_tsr_ci95": json.dumps(change["delta_task_solving_rate_ci95"]),
                "dev_mcnemar_p": change["mcnemar_p"], "dev_before_rubric_pass": before["rubric_pass_rate"],
                "dev_rubric_pass": after["rubric_pass_rate"]}
        versions = tracking.register_prompts(result.program, build_program(method, ablate, layout=layout),
                                             tuned=tuple(tunable), run_id=active.info.run_id, message=message,
                                             tags=tags, alias=alias)
        tracking.log_program(result.program, versions=versions, example=INPUT_EXAMPLE)
    return result
