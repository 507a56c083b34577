"""The commands that plan and spend an optimization budget: `optimize` (an estimate of
its LM calls first, then the tracked compile) and `split` (a split manifest), each saying
what difference its dev and test splits can detect before anything is spent."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
from contextlib import contextmanager

from cg_dspy.clbench import data
from cg_dspy.clbench.rows import GradedRow
from cg_dspy.cli import console
from cg_dspy.cli.arguments import lm_settings
from cg_dspy.cli.console import EXIT_CAPPED, EXIT_FAILED, EXIT_OK, say
from cg_dspy.core.redact import printable
from cg_dspy.judge.voting import judge_lm
from cg_dspy.lms import LMSettings, build_lm
from cg_dspy.reports import analysis


def optimize(args) -> int:
    from cg_dspy.optimize import simulate
    from cg_dspy.optimize.compile import check_splits
    from cg_dspy.saved import check_output
    from cg_dspy.workflows.optimize import optimize as tracked_optimize

    inputs = (console.file_input(args.train), console.file_input(args.dev), console.file_input(args.test))
    check_output(args.out, force=args.force, inputs=inputs)  # before any work
    train, train_errors = console.load(args.train, args.strict, None)
    dev, dev_errors = console.load(args.dev, args.strict, None)
    test, test_errors = console.load(args.test, args.strict, None) if args.test else (None, [])
    check_splits(train, dev, test)
    power = _power(args, {"dev": len(dev), **({"test": len(test)} if test else {})})
    task_settings, judge_settings = lm_settings(args), lm_settings(args, "judge-")
    reflection = None
    if args.reflection_model:
        reflection = build_lm(LMSettings(model=args.reflection_model, api_base=args.reflection_api_base,
                                         temperature=1.0, max_tokens=4000, cache=not args.no_cache))
    options = dict(optimizer=args.optimizer, train=train, dev=dev, test=test, budget=args.budget,
                   task_lm=build_lm(task_settings), judge_lm=judge_lm(judge_settings), reflection_lm=reflection,
                   method=args.method, ablate=tuple(args.ablate), tunable=args.tunable, layout=args.layout,
                   policy=args.policy, revision_mode=args.revision_mode,
                   threads=args.threads, dev_votes=args.dev_votes)
    with _quiet_optimizers():
        estimate = simulate.estimate(**options)
    say(f"estimate: {_calls(estimate['calls'])} LM calls, {estimate['prompt_tokens']['total']:,} prompt tokens "
        "(a simulated fresh run; the assumptions are in the JSON)")
    if args.dry_run:
        print(json.dumps({"estimate": estimate, "dev_power": power}, indent=1))
        return EXIT_OK
    with contextlib.redirect_stdout(sys.stderr):  # optimizers print progress; stdout is the JSON below
        result = tracked_optimize(
            settings=console.tracking(args), alias=args.alias, **options, out=args.out, force=args.force, inputs=inputs,
            max_calls=args.max_calls, estimate=estimate, progress=not args.quiet,
            params={"task_lm": task_settings.describe(), "judge_lm": judge_settings.describe(),
                    "train": args.train, "dev": args.dev, "test": args.test or ""})
    say(f"called: {_calls(result.calls)} LM calls (estimated {_calls(estimate['calls'])})")
    shown = {k: {key: v for key, v in scores.items() if key != "per_task"}
             for k, scores in (("dev_before", result.dev_before), ("dev_after", result.dev_after))}
    change = result.dev_change if result.dev_before and result.dev_after else None
    print(json.dumps({**shown, "dev_change": change, "test": result.test, "dev_power": power,
                      "capped": result.capped, "stopped": result.stopped, "calls": result.calls,
                      "estimate": estimate, "program": args.out, "mlflow_run": result.run_id,
                      "judge_calls": result.judge_calls}, indent=1))
    if result.capped:
        say(f"contextguard: stopped at --max-calls {args.max_calls}: {result.stopped}; saved to {args.out}")
        return EXIT_CAPPED
    failed = {k: v for k, v in (("before", result.dev_before), ("after", result.dev_after)) if v["errors"]}
    for when, scores in failed.items():
        say(f"contextguard: {scores['errors']} dev task(s) failed with an error {when} compiling (scored 0); "
            f"the first: {printable(scores['first_error'])}")
    return EXIT_FAILED if train_errors or dev_errors or test_errors or failed else EXIT_OK


def _calls(calls: dict) -> str:
    parts = ", ".join(f"{role} {n:,}" for role, n in calls.items() if role != "total" and n)
    return f"{calls.get('total', 0):,}" + (f" ({parts})" if parts else "")


@contextmanager
def _quiet_optimizers():
    """The estimate plays the whole run: its optimizers' progress is not the run's."""
    loggers = [logging.getLogger(name) for name in ("dspy", "gepa", "optuna")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _discordance(args) -> tuple[float, str]:
    """The share of tasks whose outcome flips between two programs: from two graded files
    the user gives (`--discordance-from BEFORE AFTER`), else the paper's Table 14."""
    from cg_dspy.reports.statistics import PAPER_DISCORDANCE

    if not getattr(args, "discordance_from", None):
        return PAPER_DISCORDANCE, "the paper's Table 14 (200 of 1,899 tasks changed outcome)"
    before, after = (console.read(path, GradedRow, "graded")[0] for path in args.discordance_from)
    paired = analysis.compare(before, after).paired
    flipped = paired.newly + paired.broken
    if not flipped:
        raise ValueError(f"{' and '.join(args.discordance_from)}: no task changed outcome, so no discordance rate "
                         "to plan with")
    return flipped / paired.tasks, (f"{args.discordance_from[0]} -> {args.discordance_from[1]} "
                                    f"({flipped} of {paired.tasks} tasks changed outcome)")


def _power(args, sizes: dict[str, int]) -> dict:
    """The smallest paired difference in TSR each split detects (80% power, alpha 0.05),
    said on stderr and returned for the JSON."""
    from cg_dspy.reports.statistics import detectable_difference

    discordance, source = _discordance(args)
    found = {name: detectable_difference(n, discordance) for name, n in sizes.items()}
    for name, points in found.items():
        say(f"{name}: {sizes[name]} tasks " + (f"detect a paired difference in task-solving rate of {points:.1f} "
                                                 "points or more" if points is not None else
                                                 "are too few to detect any difference") +
            f" (80% power, two-sided alpha 0.05, discordance {discordance:.3f} from {source})")
    return {"detectable_difference": found, "discordance": round(discordance, 4), "discordance_from": source}


def split(args) -> int:
    from cg_dspy.core import files

    files.check(args.out, data.MANIFEST, force=args.force, inputs=(console.file_input(args.tasks),))  # before reading
    loaded = data.load_tasks(args.tasks)
    fractions = tuple(float(x) for x in args.fractions.split(","))
    splits = data.make_splits(loaded.tasks, fractions, seed=args.seed)
    sizes = {k: len(v) for k, v in splits.items()}
    power = _power(args, {k: n for k, n in sizes.items() if k != "train"})
    if args.register:  # the store answers before anything is written
        from cg_dspy import tracking

        tracking.setup(args.tracking_uri, args.experiment)
    data.write_manifest(args.out, splits, seed=args.seed, source=args.tasks, force=args.force)
    registered = {}
    if args.register:
        by_id = {t.idx: t for t in loaded.tasks}
        for name, ids in splits.items():
            if ids:
                dataset = tracking.register_split(name, [by_id[i] for i in ids], source=f"{args.out}#{name}")
                registered[name] = dataset.name
    print(json.dumps({**sizes, **power, **({"datasets": registered} if registered else {})}))
    return EXIT_OK
