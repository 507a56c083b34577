"""The `contextguard` command. Thin: it parses arguments, calls the library and prints.

Exit status: 0 when every task finished, 1 when some task, input row or grade failed
(each is listed), 2 for unusable input or arguments (one line naming the file, line,
task and field), 3 when `optimize` stopped at --max-calls (the best program so far is
saved), 130 when interrupted (rerun the same command to resume). Tracebacks
are for real bugs, and only with --debug.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from cg_dspy.evaluation import data, harness, judge
from cg_dspy.evaluation.rows import GradedRow, ResultRow, read_jsonl, validated
from cg_dspy.evaluation.rubric_types import LMUnreachable
from cg_dspy.evaluation.store import OutputRefused
from cg_dspy.lms import DEFAULT_TIMEOUT, LMSettings, build_lm, patches
from cg_dspy.lms.endpoint import STRUCTURED_OUTPUT
from cg_dspy.method import LAYOUTS, METHODS, build_program, method_names
from cg_dspy.method.program import ABLATIONS
from cg_dspy.optimize.compile import DEFAULT_TUNABLE, DevFailed
from cg_dspy.optimize.recipes import BUDGETS, RECIPES
from cg_dspy.redact import printable, scrub
from cg_dspy.reports import analysis, markdown
from cg_dspy.saved import MAX_ROUNDS, ProgramRefused

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CAPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
JUDGE_TEMPERATURE = 0.6
USER_ERRORS = (data.InvalidInput, OSError, ValueError, OutputRefused, ProgramRefused)  # files, paths, values


def _say(text: str) -> None:
    """One line of stderr, with keys scrubbed."""
    print(scrub(text), file=sys.stderr)


# --- argument types: bad numbers are refused by argparse, exit 2 ---------------------


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def rounds(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_ROUNDS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_ROUNDS}, got {value}")
    return value


def odd_votes(text: str) -> int:
    value = positive_int(text)
    if value % 2 == 0:
        raise argparse.ArgumentTypeError(f"K = {value} can tie, and a tie has no majority ('yes' needs more than "
                                         "K/2 votes); use an odd K")
    return value


def _add_lm_flags(p: argparse.ArgumentParser, prefix: str = "", role: str = "task") -> None:
    env = "CG_JUDGE_" if prefix else "CG_"
    p.add_argument(f"--{prefix}model", help=f"LiteLLM model string for the {role} LM (env {env}MODEL); "
                   "default: the embedded local model")
    p.add_argument(f"--{prefix}api-base", help=f"OpenAI-compatible endpoint URL (env {env}API_BASE)")
    p.add_argument(f"--{prefix}temperature", type=float, help=f"sampling temperature (env {env}TEMPERATURE)")
    p.add_argument(f"--{prefix}max-tokens", type=positive_int, help=f"max output tokens per call (env "
                   f"{env}MAX_TOKENS); default: the server's own (the embedded model: 384)")
    p.add_argument(f"--{prefix}structured-output", choices=STRUCTURED_OUTPUT, default="auto",
                   help="how typed stages ask an OpenAI-compatible server for JSON: auto tries json_schema, then "
                   "json_object with a schema, then none, and keeps what the server accepts")
    p.add_argument(f"--{prefix}item-limit", type=positive_int, help="items per audit/checker list the output "
                   "schema allows (default 24; the embedded model: 2)")
    p.add_argument(f"--{prefix}item-chars", type=positive_int, help="characters per audit/checker item (default "
                   "500, also the most a schema bound carries: llama.cpp's grammar compiler fails on longer ones; "
                   "the embedded model: 100)")


def _lm_settings(args, prefix: str = "") -> LMSettings:
    attr = prefix.replace("-", "_")
    return LMSettings.from_env(
        "CG_JUDGE_" if prefix else "CG_",
        model=getattr(args, f"{attr}model"),
        api_base=getattr(args, f"{attr}api_base"),
        temperature=getattr(args, f"{attr}temperature"),
        max_tokens=getattr(args, f"{attr}max_tokens"),
        structured_output=getattr(args, f"{attr}structured_output"),
        item_limit=getattr(args, f"{attr}item_limit"),
        item_chars=getattr(args, f"{attr}item_chars"),
        cache=not args.no_cache,
        num_retries=args.retries,
        timeout=args.timeout,
    )


def _shard(tasks, spec: str | None):
    if not spec:
        return tasks
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: write it as i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec}: need 0 <= i < n")
    return [t for t in tasks if int(hashlib.sha256(t.idx.encode()).hexdigest(), 16) % n == i]


def _load(source: str, strict: bool, shard: str | None):
    """Tasks to run; bad rows are reported (and stop the run with --strict); no task at
    all is unusable input."""
    loaded = data.select(source, strict=strict)
    for err in loaded.errors:
        _say(f"skipped {printable(err)}")
    if not loaded.tasks:
        raise data.InvalidInput(loaded.errors) if loaded.errors else ValueError(f"{source}: holds no tasks")
    return _shard(loaded.tasks, shard), loaded.errors


def _file_input(source: str) -> str | None:
    """The file behind a task source, so no output overwrites it."""
    path = source.split("#")[0]
    return path if Path(path).exists() else None


def _report_failures(failed, what: str) -> None:
    for idx, reason in failed:
        _say(f"failed {what} {printable(idx)}: {printable(reason)}")


def _report_differences(differences: list[str], out) -> None:
    if differences:
        _say(f"resumed rows of {out} written by other settings (--resume-anyway): {'; '.join(differences)}")


def _interrupted(out) -> None:
    _say(f"Stopped early. Rerun the same command to resume; finished rows are kept in {out}.")


def _status(outcome, input_errors) -> int:
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if outcome.failed or input_errors else EXIT_OK


def _read(path: str, model, what: str):
    """Rows of a file from anywhere: every unreadable line and duplicate is named."""
    rows, errors = validated(read_jsonl(path), model)
    for err in errors:
        _say(f"skipped {printable(err)}")
    if not rows:
        raise ValueError(f"{path}: holds no {what} rows")
    return rows, errors


@contextmanager
def _tracked(args, name: str, kind: str, params: dict):
    """An MLflow run of `kind` (unless --no-track); it ends KILLED when stopped early."""
    if args.no_track:
        yield None
        return
    from cg_dspy import tracking

    tracking.setup(args.tracking_uri, args.experiment)
    with tracking.run(name, kind=kind, params=params) as active:
        yield active


@contextmanager
def _traced(args, active):
    """Every task in this block traced, inside the run (unless --no-track / --no-trace);
    yields the trace report, complete when the block ends."""
    if active is None or args.no_trace:
        yield None
        return
    from cg_dspy import tracking

    with tracking.tracing() as report:
        yield report


def _traces_said(report) -> dict:
    """What tracing stored, said once when anything was lost; for the summary."""
    if report is None:
        return {}
    warning = report.warning()
    if warning:
        _say(f"contextguard: {warning}")
    return report.as_dict()


def cmd_run(args) -> int:
    tasks, errors = _load(args.tasks, args.strict, args.shard)
    if args.program:
        from cg_dspy import tracking
        from cg_dspy.saved import load_program

        if ":/" in args.program:
            tracking.setup(args.tracking_uri, create=False)
        program = load_program(args.program, lenient=args.lenient_program)
        method = program.config()["method"]  # the saved program says what it is
    else:
        program = build_program(args.method, args.ablate, args.max_rounds, layout=args.layout)
        method = args.method
    settings = _lm_settings(args)
    lm = build_lm(settings)
    params = {"tasks": args.tasks, "method": method, "program": program.config(), "saved_program": args.program or "",
              "task_count": len(tasks), "task_lm": settings.describe(), "threads": args.threads}
    outs = [(Path(args.out), None)] if args.repeats == 1 else \
        [(harness.repeat_path(args.out, i), i) for i in range(1, args.repeats + 1)]
    summaries, status = {}, EXIT_OK
    for out, repeat in outs:
        with _tracked(args, f"run-{out.stem}", "run", {**params, "out": str(out), "repeat": repeat}) as active:
            with _traced(args, active) as traces:
                result = harness.run(program, tasks, out, lm=lm, method=method, threads=args.threads,
                                     progress=not args.quiet, force=args.force, resume_anyway=args.resume_anyway,
                                     inputs=(_file_input(args.tasks), args.program), repeat=repeat)
            if traces is not None:
                result.summary["traces"] = _traces_said(traces)
            if active:
                from cg_dspy import tracking

                tracking.log_run_summary(result.summary)
                if result.outcome.interrupted:
                    active.stopped_early()
        summaries[str(out)] = result.summary
        _report_differences(result.differences, out)
        _report_failures(result.outcome.failed, "task")
        status = max(status, _status(result.outcome, errors))
        if result.outcome.interrupted:
            _interrupted(out)
            break
    print(json.dumps(summaries[str(outs[0][0])] if args.repeats == 1 else summaries, indent=1))
    return status


def cmd_eval(args) -> int:
    rows, errors = _read(args.results, ResultRow, "result")
    settings = _lm_settings(args, "judge-")
    judge_lm = build_lm(settings, default_temperature=JUDGE_TEMPERATURE)
    params = {"results": args.results, "out": args.out, "protocol": args.protocol, "votes": args.votes,
              "early_stop": not args.no_early_stop, "judge_lm": settings.describe()}
    name = Path(args.out).name
    with _tracked(args, f"eval-{Path(args.results).stem}", "eval", params) as active:
        with _traced(args, active) as traces:
            graded = judge.grade_file(rows, args.out, judge_lm=judge_lm, protocol=args.protocol, votes=args.votes,
                                      early_stop=not args.no_early_stop, threads=args.threads,
                                      progress=not args.quiet, force=args.force, resume_anyway=args.resume_anyway,
                                      inputs=(args.results,))
        traced = _traces_said(traces)
        result = analysis.report({name: graded.rows})  # tokenizes every conversation once
        if active:
            from cg_dspy import tracking

            tracking.log_report(result, per_run=False)
            tracking.log_metrics(traced, prefix="traces.")
            tracking.log_text(markdown.to_markdown(result), "report.md")
            if graded.outcome.interrupted:
                active.stopped_early()
    summary = result["runs"][name]
    print(json.dumps({k: summary[k] for k in ("tasks", "solved", "task_solving_rate", "near_miss")}, indent=1))
    _report_differences(graded.differences, args.out)
    _report_failures(graded.outcome.failed, "to grade")
    if graded.outcome.interrupted:
        _interrupted(args.out)
    return _status(graded.outcome, errors)


def _lm_typer(args):
    """The judge LM as requirement typer (at temperature 0: a label, not a sample), or None."""
    if args.rubric_types != "lm":
        return None
    from cg_dspy.evaluation.rubric_types import LMTyper

    settings = dataclasses.replace(_lm_settings(args, "judge-"), cache=False)  # see LMTyper
    return LMTyper(build_lm(settings, default_temperature=0.0), threads=args.threads)


def _typer(args, files: dict[str, list]) -> dict:
    """`report`'s typer arguments: keyword cues, or the judge LM over every unique rubric."""
    typer = _lm_typer(args)
    if typer is None:
        return {}
    typer.type_files(files)
    _say_typed(typer)
    return {"typer": typer, "typer_name": typer.describe()}


def _say_typed(typer) -> None:
    """What the LM typer did, for `report` and `bench` alike."""
    _say(f"requirement types: {typer.typed} rubrics typed by the judge LM, {typer.calls} LM calls this time"
         + (f", {len(typer.failed)} failed (left untyped; rerun to try again)" if typer.failed else ""))
    for line in typer.failed[:5]:
        _say(f"  {line}")
    for line in typer.unsaved:
        _say(f"requirement types not cached (the next report asks again): {line}")


def cmd_report(args) -> int:
    from cg_dspy.reports import html, plots

    if args.html:  # refused before any work (and before any LM call of the typer)
        html.check(args.html)
    if args.plots:
        plots.check(args.plots)
    files, errors = {}, []
    for path in args.graded:
        rows, bad = _read(path, GradedRow, "graded")
        files[path] = rows
        errors += bad
    typer = _typer(args, files)
    result = analysis.report_files(files, **typer)
    for note in result.get("notes") or ():
        _say(f"note: {printable(note)}")
    drawn = plots.rendered(result) if args.plots or args.html else None  # drawn once for both
    if args.plots:
        plots.write_all(result, args.plots, drawn)
    if args.html:
        html.write(result, args.html, drawn)
    print(json.dumps(result, indent=1) if args.format == "json" else markdown.to_markdown(result))
    return EXIT_FAILED if errors else EXIT_OK


def cmd_bench(args) -> int:
    from cg_dspy.evaluation import bench

    tasks, errors = _load(args.tasks, args.strict, args.shard)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        build_program(m)  # fail fast on a bad name
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir}: --out-dir names a folder; this is a file")
    from cg_dspy.reports import outputs

    outputs.check(out_dir)  # what bench writes last is refused first

    typer = _lm_typer(args)

    def go():
        return bench.run_bench(
            tasks, methods, out_dir, lm=build_lm(_lm_settings(args)),
            judge_lm=build_lm(_lm_settings(args, "judge-"), default_temperature=JUDGE_TEMPERATURE),
            votes=args.votes, protocol=args.protocol, threads=args.threads, progress=not args.quiet,
            early_stop=not (args.no_early_stop or args.judge_stability), force=args.force,
            resume_anyway=args.resume_anyway, typer=typer,
            inputs=(_file_input(args.tasks),), layout=args.layout, repeats=args.repeats)

    params = {"tasks": args.tasks, "task_count": len(tasks), "methods": methods, "protocol": args.protocol,
              "votes": args.votes, "layout": args.layout, "task_lm": _lm_settings(args).describe(),
              "judge_lm": _lm_settings(args, "judge-").describe()}
    with _tracked(args, f"bench-{out_dir.name}", "bench", params) as active:
        with _traced(args, active) as traces:
            result = go()
        traced = _traces_said(traces)
        if active:
            from cg_dspy import tracking

            tracking.log_metrics(traced, prefix="traces.")
            if result.report:
                tracking.log_report(result.report, per_run=True)
                tracking.log_artifacts(out_dir, "bench")
            if result.interrupted:
                active.stopped_early()
    if result.report:
        if typer is not None:
            _say_typed(typer)
        print(markdown.to_markdown(result.report))
    _report_failures(result.failed, "task")
    if result.interrupted:
        _interrupted(out_dir)
        return EXIT_INTERRUPTED
    return EXIT_FAILED if errors or result.failed else EXIT_OK


def cmd_optimize(args) -> int:
    from cg_dspy import optimize, tracking
    from cg_dspy.optimize import simulate
    from cg_dspy.optimize.compile import check_splits
    from cg_dspy.saved import check_output

    inputs = (_file_input(args.train), _file_input(args.dev), _file_input(args.test) if args.test else None)
    check_output(args.out, force=args.force, inputs=inputs)  # before any work
    train, train_errors = _load(args.train, args.strict, None)
    dev, dev_errors = _load(args.dev, args.strict, None)
    test, test_errors = _load(args.test, args.strict, None) if args.test else (None, [])
    check_splits(train, dev, test)
    power = _power(args, {"dev": len(dev), **({"test": len(test)} if test else {})})
    task_settings, judge_settings = _lm_settings(args), _lm_settings(args, "judge-")
    reflection = None
    if args.reflection_model:
        reflection = build_lm(LMSettings(model=args.reflection_model, api_base=args.reflection_api_base,
                                         temperature=1.0, max_tokens=4000, cache=not args.no_cache))
    options = dict(optimizer=args.optimizer, train=train, dev=dev, test=test, budget=args.budget,
                   task_lm=build_lm(task_settings),
                   judge_lm=build_lm(judge_settings, default_temperature=JUDGE_TEMPERATURE),
                   reflection_lm=reflection, method=args.method, ablate=tuple(args.ablate),
                   tunable=tuple(args.tunable), layout=args.layout, threads=args.threads, dev_votes=args.dev_votes)
    with _quiet_optimizers():
        estimate = simulate.estimate(**options)
    _say(f"estimate: {_calls(estimate['calls'])} LM calls, {estimate['prompt_tokens']['total']:,} prompt tokens "
         "(a simulated fresh run; the assumptions are in the JSON)")
    if args.dry_run:
        print(json.dumps({"estimate": estimate, "dev_power": power}, indent=1))
        return EXIT_OK
    if not args.no_track:
        tracking.setup(args.tracking_uri, args.experiment)
    with contextlib.redirect_stdout(sys.stderr):  # optimizers print progress; stdout is the JSON below
        result = optimize.optimize(
            **options, out=args.out, track=not args.no_track, trace=not args.no_trace, alias=args.alias,
            force=args.force, inputs=inputs, max_calls=args.max_calls, estimate=estimate, progress=not args.quiet,
            params={"task_lm": task_settings.describe(), "judge_lm": judge_settings.describe(),
                    "train": args.train, "dev": args.dev, "test": args.test or ""})
    _say(f"called: {_calls(result.calls)} LM calls (estimated {_calls(estimate['calls'])})")
    shown = {k: {key: v for key, v in scores.items() if key != "per_task"}
             for k, scores in (("dev_before", result.dev_before), ("dev_after", result.dev_after))}
    change = result.dev_change if result.dev_before and result.dev_after else None
    print(json.dumps({**shown, "dev_change": change, "test": result.test, "dev_power": power,
                      "capped": result.capped, "stopped": result.stopped, "calls": result.calls,
                      "estimate": estimate, "program": args.out, "mlflow_run": result.run_id,
                      "judge_calls": result.judge_calls}, indent=1))
    if result.capped:
        _say(f"contextguard: stopped at --max-calls {args.max_calls}: {result.stopped}; saved to {args.out}")
        return EXIT_CAPPED
    failed = {k: v for k, v in (("before", result.dev_before), ("after", result.dev_after)) if v["errors"]}
    for when, scores in failed.items():
        _say(f"contextguard: {scores['errors']} dev task(s) failed with an error {when} compiling (scored 0); "
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


def cmd_compare(args) -> int:
    from cg_dspy import tracking
    from cg_dspy.tracking.compare import compare

    tracking.setup(args.tracking_uri, args.experiment, create=False)
    result = compare(args.experiment, stages=args.stage, a=args.a, b=args.b)
    if args.format == "json":
        print(json.dumps(result, indent=1))
        return EXIT_OK
    print(markdown.compare_markdown(result))
    return EXIT_OK


def _discordance(args) -> tuple[float, str]:
    """The share of tasks whose outcome flips between two programs: from two graded files
    the user gives (`--discordance-from BEFORE AFTER`), else the paper's Table 14."""
    from cg_dspy.reports.statistics import PAPER_DISCORDANCE

    if not getattr(args, "discordance_from", None):
        return PAPER_DISCORDANCE, "the paper's Table 14 (200 of 1,899 tasks changed outcome)"
    before, after = (_read(path, GradedRow, "graded")[0] for path in args.discordance_from)
    change = analysis.compare(before, after)
    flipped = change["newly_solved"] + change["broken_solved"]
    if not flipped:
        raise ValueError(f"{' and '.join(args.discordance_from)}: no task changed outcome, so no discordance rate "
                         "to plan with")
    return flipped / change["tasks_compared"], f"{args.discordance_from[0]} -> {args.discordance_from[1]} " \
                                                f"({flipped} of {change['tasks_compared']} tasks changed outcome)"


def _power(args, sizes: dict[str, int]) -> dict:
    """The smallest paired difference in TSR each split detects (80% power, alpha 0.05),
    said on stderr and returned for the JSON."""
    from cg_dspy.reports.statistics import detectable_difference

    discordance, source = _discordance(args)
    found = {name: detectable_difference(n, discordance) for name, n in sizes.items()}
    for name, points in found.items():
        _say(f"{name}: {sizes[name]} tasks " + (f"detect a paired difference in task-solving rate of {points:.1f} "
                                                  "points or more" if points is not None else
                                                  "are too few to detect any difference") +
             f" (80% power, two-sided alpha 0.05, discordance {discordance:.3f} from {source})")
    return {"detectable_difference": found, "discordance": round(discordance, 4), "discordance_from": source}


def cmd_split(args) -> int:
    from cg_dspy.core import files

    files.check(args.out, data.MANIFEST, force=args.force, inputs=(_file_input(args.tasks),))  # before reading
    loaded = data.load_tasks(args.tasks)
    fractions = tuple(float(x) for x in args.fractions.split(","))
    splits = data.make_splits(loaded.tasks, fractions, seed=args.seed)
    sizes = {k: len(v) for k, v in splits.items()}
    power = _power(args, {k: n for k, n in sizes.items() if k != "train"})
    data.write_manifest(args.out, splits, seed=args.seed, source=args.tasks, force=args.force)
    print(json.dumps({**sizes, **power}))
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="contextguard", description="ContextGuard on CL-bench, in DSPy.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def layout(sp):
        sp.add_argument("--layout", choices=LAYOUTS, default="chat",
                        help="chat: every stage after the draft continues the draft's chat, so a prefix-caching "
                        "server prefills only the stage's own text (default); inline: the stage is appended to "
                        "the task's last message")

    def common(sp, judge_flags=False, task_flags=True, grading=True):
        sp.add_argument("--threads", type=positive_int, default=4, help="LM requests kept in flight (default 4)")
        sp.add_argument("--no-cache", action="store_true", help="bypass DSPy's LM cache")
        sp.add_argument("--retries", type=int, default=4,
                        help="retries per LM call on 429, 5xx and dropped connections, with backoff (default 4)")
        sp.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds to wait for one LM reply (default {DEFAULT_TIMEOUT:g}); a reply that does not "
                        "come in time is not retried (the server may still be generating it)")
        sp.add_argument("--quiet", action="store_true", help="no progress bar")
        if task_flags:
            _add_lm_flags(sp)
        if judge_flags:
            _add_lm_flags(sp, "judge-", "judge")
        if judge_flags and grading:
            sp.add_argument("--votes", type=odd_votes, default=3, help="judge votes per requirement (odd K, default 3)")
            sp.add_argument("--protocol", choices=judge.PROTOCOLS, default="rubric",
                            help="rubric: one requirement per call, majority of K; joint: CL-bench's official")
            sp.add_argument("--no-early-stop", action="store_true", help="always draw all K votes")

    def rubric_types(sp):
        sp.add_argument("--rubric-types", choices=("keyword", "lm"), default="keyword",
                        help="who types requirements for Table 2: keyword cues (offline, default) or the judge LM "
                        "(one call per unique rubric, cached beside each graded file)")

    def output(sp):
        sp.add_argument("--force", action="store_true", help="replace an output this command would not resume")
        sp.add_argument("--resume-anyway", action="store_true",
                        help="resume rows written with other settings, and say what differs")

    r = sub.add_parser("run", help="generate answers for tasks with one method")
    r.add_argument("tasks", help="CL-bench JSONL file, tencent/CL-bench[:split], or MANIFEST.json#split")
    r.add_argument("--method", choices=METHODS, default="contextguard")
    r.add_argument("--ablate", nargs="*", choices=ABLATIONS, default=[], help="ContextGuard components to remove")
    r.add_argument("--max-rounds", type=rounds, default=1, help=f"protected revision rounds, 1-{MAX_ROUNDS} (paper: 1)")
    r.add_argument("--out", required=True, help="result JSONL (resumed if it exists)")
    r.add_argument("--repeats", type=positive_int, default=1,
                   help="independent runs, each its own file (OUT.r1.jsonl, …) and sample (its own rollout id); "
                   "`report` reads them as repeats (mean ± std). At temperature 0 they measure only the server's "
                   "nondeterminism")
    r.add_argument("--strict", action="store_true", help="stop before any LM call if any input row is bad")
    r.add_argument("--shard", help="i/n: run only shard i of n (stable hash of task id)")
    r.add_argument("--program", help="a compiled program: JSON file or MLflow URI (runs:/ID)")
    r.add_argument("--lenient-program", action="store_true",
                   help="drop (with a warning) what a saved program may not hold, instead of refusing it")
    r.add_argument("--tracking-uri", help="MLflow store holding --program (default: MLFLOW_TRACKING_URI or "
                   "sqlite:///mlflow.db)")
    common(r)
    output(r)
    layout(r)
    r.set_defaults(fn=cmd_run)

    e = sub.add_parser("eval", help="judge a result file with the rubric judge")
    e.add_argument("results", help="result JSONL written by `run` (or any CL-bench results file)")
    e.add_argument("--out", required=True, help="graded JSONL (resumed if it exists)")
    common(e, judge_flags=True, task_flags=False)
    output(e)
    e.set_defaults(fn=cmd_eval)

    rp = sub.add_parser("report", help="tables (and plots) from graded files")
    rp.add_argument("graded", nargs="+", help="graded JSONL; with two runs, the first is 'before'")
    rp.add_argument("--format", choices=("markdown", "json"), default="markdown")
    rp.add_argument("--plots", help="directory for PNG figures")
    rp.add_argument("--html", help="write the report as one self-contained HTML page (tables and figures)")
    rubric_types(rp)
    common(rp, judge_flags=True, task_flags=False, grading=False)
    rp.set_defaults(fn=cmd_report)

    b = sub.add_parser("bench", help="run and judge several methods, paired on the same drafts")
    b.add_argument("tasks")
    b.add_argument("--methods", default="baseline,self-refine,contextguard",
                   help=f"comma-separated, from {','.join(method_names())}")
    b.add_argument("--out-dir", required=True)
    b.add_argument("--strict", action="store_true")
    b.add_argument("--shard")
    b.add_argument("--repeats", type=positive_int, default=1,
                   help="run (and judge) every method this many times, each its own sample; the report gives "
                   "mean ± std and pairs methods by each task's majority outcome")
    b.add_argument("--judge-stability", action="store_true",
                   help="grade with every vote drawn (no early stop), so the report has judge stability (Table 5)")
    rubric_types(b)
    common(b, judge_flags=True)
    output(b)
    layout(b)
    b.set_defaults(fn=cmd_bench)

    def tracked(sp, tracking_uri=True):
        sp.add_argument("--experiment", default="contextguard", help="MLflow experiment (default contextguard)")
        if tracking_uri:
            sp.add_argument("--tracking-uri",
                            help="MLflow store (env MLFLOW_TRACKING_URI; default sqlite:///mlflow.db)")
        sp.add_argument("--no-track", action="store_true", help="do not log an MLflow run")
        sp.add_argument("--no-trace", action="store_true", help="log the run but no trace per task")

    tracked(r, tracking_uri=False)
    tracked(e)
    tracked(b)

    def discordance(sp):
        sp.add_argument("--discordance-from", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="two graded files of the same tasks whose share of changed outcomes sizes the smallest "
                        "detectable difference (default: the paper's Table 14, 200 of 1,899)")

    o = sub.add_parser("optimize", help="compile ContextGuard with a DSPy optimizer, tracked in MLflow")
    o.add_argument("--optimizer", required=True, choices=sorted(RECIPES))
    o.add_argument("--train", required=True, help="tasks: JSONL file, tencent/CL-bench, or MANIFEST.json#train")
    o.add_argument("--dev", required=True, help="tasks for scoring candidates and the result")
    o.add_argument("--budget", choices=BUDGETS, default="light")
    o.add_argument("--out", required=True, help="compiled program (JSON state)")
    o.add_argument("--method", default="contextguard", choices=METHODS)
    o.add_argument("--ablate", nargs="*", choices=ABLATIONS, default=[])
    o.add_argument("--tunable", nargs="+", default=list(DEFAULT_TUNABLE),
                   help=f"predictors the optimizer may change (default: {' '.join(DEFAULT_TUNABLE)})")
    o.add_argument("--reflection-model", help="LM that proposes instructions (GEPA, MIPROv2); default: task LM")
    o.add_argument("--reflection-api-base")
    o.add_argument("--strict", action="store_true")
    o.add_argument("--alias", help="set this alias (e.g. best) on the run's tuned prompt versions")
    o.add_argument("--force", action="store_true", help="replace --out even if it is not a saved program")
    o.add_argument("--test", help="held-out tasks (no task of train or dev): the untuned and the tuned program are "
                   "scored on them once at the end, with the paper's judge, paired")
    o.add_argument("--dev-votes", type=odd_votes, default=3,
                   help="judge votes per requirement when scoring dev and selecting (odd K, default 3: the paper's)")
    o.add_argument("--max-calls", type=positive_int,
                   help="stop at this many LM calls in all (task, judge, reflection): the best program scored on "
                   "the whole dev set so far is saved, registered and tagged capped; exit 3")
    o.add_argument("--dry-run", action="store_true",
                   help="print the estimate of LM calls and prompt tokens (a simulated run) and stop: no LM call, "
                   "no program written")
    discordance(o)
    common(o, judge_flags=True)
    tracked(o)
    layout(o)
    o.set_defaults(fn=cmd_optimize)

    c = sub.add_parser("compare", help="prompt versions from the Prompt Registry side by side, and the runs")
    c.add_argument("--experiment", default="contextguard")
    c.add_argument("--stage", nargs="*", help="stages to show (default: every stage with a tuned version)")
    c.add_argument("--a", type=positive_int, help="version to diff from (default: the base version)")
    c.add_argument("--b", type=positive_int, help="version to diff to (default: the best by dev task-solving rate)")
    c.add_argument("--tracking-uri")
    c.add_argument("--format", choices=("markdown", "json"), default="markdown")
    c.set_defaults(fn=cmd_compare)

    s = sub.add_parser("split", help="write a deterministic train/dev/test split manifest")
    s.add_argument("tasks")
    s.add_argument("--out", required=True)
    s.add_argument("--fractions", default="0.2,0.2,0.6")
    s.add_argument("--seed", default="cg-dspy-1")
    s.add_argument("--force", action="store_true", help="replace an existing file that is not a manifest")
    discordance(s)
    s.set_defaults(fn=cmd_split)
    return p


class _Shortened(logging.Filter):
    """DSPy's optimizers log a failed example whole (a CL-bench context runs to 200K
    characters): keep the line, not the context."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if len(text) > 600:
            record.msg, record.args = f"{text[:300]} … {text[-200:]}", None
        return True


class _KnownTruncation(logging.Filter):
    """DSPy logs every reply cut at max_tokens; each stage records it and the run
    summary counts it (`truncated_replies`), so the line per call is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("LM response was truncated")


# Offline and quiet: LiteLLM's bundled cost map instead of a download, and no usage
# telemetry from the libraries we load.
ENVIRONMENT = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


def _quiet_logs() -> None:
    """The command's log filters, once per process (main may run many times in one)."""
    lm = logging.getLogger("dspy.clients.lm")
    if not any(isinstance(f, _KnownTruncation) for f in lm.filters):
        lm.addFilter(_KnownTruncation())
        for name in ("dspy.utils.parallelizer", "dspy.teleprompt", "dspy.evaluate"):
            logging.getLogger(name).addFilter(_Shortened())


def _terminated(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    patches.install()
    _quiet_logs()
    previous = None
    if threading.current_thread() is threading.main_thread():  # a SIGTERM ends like Ctrl-C: cleanly, exit 130
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        _say("contextguard: stopped early. Rerun the same command to continue; finished rows are kept.")
        return EXIT_INTERRUPTED
    except USER_ERRORS as exc:
        if args.debug:
            raise
        for line in str(exc).splitlines() or [type(exc).__name__]:
            _say(f"contextguard: {printable(line)}")
        return EXIT_USAGE
    except (DevFailed, LMUnreachable) as exc:  # the LMs answer nothing: nothing to report
        _say(f"contextguard: {printable(str(exc))}")
        return EXIT_FAILED
    except Exception as exc:  # a bug of ours: say so in one line, the traceback with --debug
        if args.debug:
            raise
        _say(f"contextguard: internal error ({type(exc).__name__}: {str(exc)[:300]}); rerun with --debug for "
             "the traceback")
        return EXIT_FAILED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
