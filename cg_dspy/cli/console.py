"""What every command shares: exit codes, one scrubbed line of stderr, inputs read with
every bad row named, the tracking settings from the flags, and what is said afterwards
(failures, resumed settings, interruptions)."""

from __future__ import annotations

import sys
from pathlib import Path

from cg_dspy import workflows
from cg_dspy.clbench import data
from cg_dspy.clbench.rows import read_jsonl, validated
from cg_dspy.core.redact import printable, scrub

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CAPPED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def say(text: str) -> None:
    """One line of stderr, with keys scrubbed."""
    print(scrub(text), file=sys.stderr)


# --- inputs -------------------------------------------------------------------------


def load(source: str, strict: bool, shard: str | None):
    """Tasks to run; bad rows are reported (and stop the run with --strict); no task at
    all is unusable input."""
    loaded = data.select(source, strict=strict)
    for err in loaded.errors:
        say(f"skipped {printable(err)}")
    if not loaded.tasks:
        raise data.InvalidInput(loaded.errors) if loaded.errors else ValueError(f"{source}: holds no tasks")
    return data.shard(loaded.tasks, shard), loaded.errors


def read(path: str, model, what: str):
    """Rows of a file from anywhere: every unreadable line and duplicate is named."""
    rows, errors = validated(read_jsonl(path), model)
    for err in errors:
        say(f"skipped {printable(err)}")
    if not rows:
        raise ValueError(f"{path}: holds no {what} rows")
    return rows, errors


def file_input(source: str | None) -> str | None:
    """The file behind a task source, so no output overwrites it."""
    if not source:
        return None
    path = source.split("#")[0]
    return path if Path(path).exists() else None


def tracking(args) -> workflows.Tracking:
    return workflows.Tracking(enabled=not args.no_track, uri=getattr(args, "tracking_uri", None),
                              experiment=args.experiment, trace=not args.no_trace)


# --- what is said afterwards --------------------------------------------------------


def failures(failed, what: str) -> None:
    for idx, reason in failed:
        say(f"failed {what} {printable(idx)}: {printable(reason)}")


def differences(differences: list[str], out) -> None:
    if differences:
        say(f"resumed rows of {out} written by other settings (--resume-anyway): {'; '.join(differences)}")


def warnings(warnings: list[str]) -> None:
    for warning in warnings:
        say(f"contextguard: {warning}")


def interrupted(out) -> None:
    say(f"Stopped early. Rerun the same command to resume; finished rows are kept in {out}.")


def status(outcome, input_errors) -> int:
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if outcome.failed or input_errors else EXIT_OK
