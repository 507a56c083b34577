"""What each subcommand does: read its inputs (bad rows named on stderr), call one
workflow (cg_dspy.workflows), print its result on stdout and return the exit status.
No policy lives here: defaults belong to the judge, the method and the workflows.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from cg_dspy import workflows
from cg_dspy.clbench.rows import GradedRow, ResultRow
from cg_dspy.cli import console
from cg_dspy.cli.arguments import lm_settings
from cg_dspy.cli.console import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, say
from cg_dspy.cli.tuning import optimize, split
from cg_dspy.core.redact import printable
from cg_dspy.judge.voting import judge_lm
from cg_dspy.lms import build_lm
from cg_dspy.method import build_program
from cg_dspy.method.specialists import dump_policy
from cg_dspy.reports import analysis
from cg_dspy.reports.render import markdown


def run(args) -> int:
    tasks, errors = console.load(args.tasks, args.strict, args.shard)
    if args.program and (args.policy or args.revision_mode != "rewrite"):
        raise ValueError("--policy, --revision-mode: a saved program (--program) carries its own category policy "
                         "and revision mode")
    if args.program:
        from cg_dspy.saved import load_program

        if ":/" in args.program:
            from cg_dspy import tracking

            tracking.setup(args.tracking_uri, create=False)
        program = load_program(args.program, lenient=args.lenient_program)
        method = program.config()["method"]  # the saved program says what it is
    else:
        program = build_program(args.method, args.ablate, args.max_rounds, layout=args.layout, policy=args.policy,
                                revision_mode=args.revision_mode)
        method = args.method
    settings = lm_settings(args)
    params = {"tasks": args.tasks, "method": method, "program": program.config(), "saved_program": args.program or "",
              "task_count": len(tasks), "task_lm": settings.describe(), "threads": args.threads}
    done = workflows.run(program, tasks, args.out, lm=build_lm(settings), method=method, repeats=args.repeats,
                         tracking=console.tracking(args), params=params, threads=args.threads, progress=not args.quiet,
                         force=args.force, resume_anyway=args.resume_anyway,
                         inputs=(console.file_input(args.tasks), args.program))
    console.warnings(done.warnings)
    status = EXIT_OK
    for out, result in done.results.items():
        console.differences(result.differences, out)
        console.failures(result.outcome.failed, "task")
        status = max(status, console.status(result.outcome, errors))
        if result.outcome.interrupted:
            console.interrupted(out)
    summaries = {out: result.summary for out, result in done.results.items()}
    print(json.dumps(next(iter(summaries.values())) if args.repeats == 1 else summaries, indent=1))
    return status


def evaluate(args) -> int:
    rows, errors = console.read(args.results, ResultRow, "result")
    settings = lm_settings(args, "judge-")
    params = {"results": args.results, "out": args.out, "protocol": args.protocol, "votes": args.votes,
              "early_stop": not args.no_early_stop, "judge_lm": settings.describe()}
    done = workflows.evaluate(rows, args.out, judge_lm=judge_lm(settings), tracking=console.tracking(args),
                              name=f"eval-{Path(args.results).stem}", params=params, protocol=args.protocol,
                              votes=args.votes, early_stop=not args.no_early_stop, threads=args.threads,
                              progress=not args.quiet, force=args.force, resume_anyway=args.resume_anyway,
                              inputs=(args.results,))
    console.warnings(done.warnings)
    summary = done.report.runs[Path(args.out).name]
    print(json.dumps({"tasks": summary.tasks, "solved": summary.rate.solved,
                      "task_solving_rate": summary.task_solving_rate, "task_solving_rate_ci95": summary.rate.ci95,
                      "near_miss": summary.near_miss,
                      **({"endpoints": done.graded.endpoints} if done.graded.endpoints else {})}, indent=1))
    console.differences(done.graded.differences, args.out)
    console.failures(done.graded.outcome.failed, "to grade")
    if done.graded.outcome.interrupted:
        console.interrupted(args.out)
    return console.status(done.graded.outcome, errors)


def _lm_typer(args):
    """The judge LM as requirement typer (at temperature 0: a label, not a sample), or None."""
    if args.rubric_types != "lm":
        return None
    from cg_dspy.judge.typer import LMTyper

    settings = dataclasses.replace(lm_settings(args, "judge-"), cache=False)  # see LMTyper
    return LMTyper(build_lm(settings), threads=args.threads)


def _typed(typer) -> None:
    """What the LM typer did, for `report` and `bench` alike."""
    say(f"requirement types: {typer.typed} rubrics typed by the judge LM, {typer.calls} LM calls this time"
        + (f", {len(typer.failed)} failed (left untyped; rerun to try again)" if typer.failed else ""))
    for line in typer.failed[:5]:
        say(f"  {line}")
    for line in typer.unsaved:
        say(f"requirement types not cached (the next report asks again): {line}")


def report(args) -> int:
    from cg_dspy.reports.render import html, plots

    if args.html:  # refused before any work (and before any LM call of the typer)
        html.check(args.html)
    if args.plots:
        plots.check(args.plots)
    files, errors = {}, []
    for path in args.graded:
        rows, bad = console.read(path, GradedRow, "graded")
        files[path] = rows
        errors += bad
    typed = {}
    typer = _lm_typer(args)
    if typer is not None:
        typer.type_files({path: [r for row in rows for r in row.rubrics] for path, rows in files.items()})
        _typed(typer)
        typed = {"typer": typer, "typer_name": typer.describe()}
    result = analysis.report_files(files, **typed)
    for note in result.notes:
        say(f"note: {printable(note)}")
    drawn = plots.rendered(result) if args.plots or args.html else None  # drawn once for both
    if args.plots:
        plots.write_all(result, args.plots, drawn)
    if args.html:
        html.write(result, args.html, drawn)
    print(json.dumps(result.to_dict(), indent=1) if args.format == "json" else markdown.to_markdown(result))
    return EXIT_FAILED if errors else EXIT_OK


def bench(args) -> int:
    from cg_dspy.reports import outputs
    from cg_dspy.workflows.bench import bench as run_bench

    tasks, errors = console.load(args.tasks, args.strict, args.shard)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        build_program(m)  # fail fast on a bad name
    out_dir = Path(args.out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"{out_dir}: --out-dir names a folder; this is a file")
    outputs.check(out_dir)  # what bench writes last is refused first
    typer = _lm_typer(args)
    task_settings, judge_settings = lm_settings(args), lm_settings(args, "judge-")
    params = {"tasks": args.tasks, "task_count": len(tasks), "methods": methods, "protocol": args.protocol,
              "votes": args.votes, "layout": args.layout, "policy": dump_policy(args.policy) if args.policy else "",
              "task_lm": task_settings.describe(),
              "judge_lm": judge_settings.describe()}
    result = run_bench(tasks, methods, out_dir, tracking=console.tracking(args), params=params,
                       lm=build_lm(task_settings), judge_lm=judge_lm(judge_settings), votes=args.votes,
                       protocol=args.protocol, threads=args.threads, progress=not args.quiet,
                       early_stop=not (args.no_early_stop or args.judge_stability), force=args.force,
                       resume_anyway=args.resume_anyway, typer=typer, inputs=(console.file_input(args.tasks),),
                       layout=args.layout, policy=args.policy, repeats=args.repeats)
    console.warnings(result.warnings)
    if result.report:
        if typer is not None:
            _typed(typer)
        print(markdown.to_markdown(result.report))
    console.failures(result.failed, "task")
    if result.interrupted:
        console.interrupted(out_dir)
        return EXIT_INTERRUPTED
    return EXIT_FAILED if errors or result.failed else EXIT_OK


def compare(args) -> int:
    result = workflows.compare(args.experiment, stages=args.stage, a=args.a, b=args.b, uri=args.tracking_uri)
    print(json.dumps(result, indent=1) if args.format == "json" else markdown.compare_markdown(result))
    return EXIT_OK


# The subcommand's name -> what does it (`eval` is a builtin's name in Python).
COMMANDS = {"run": run, "eval": evaluate, "report": report, "bench": bench, "optimize": optimize,
            "compare": compare, "split": split}
