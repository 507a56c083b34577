"""The `contextguard` command. Thin: it parses arguments (`arguments`), calls a workflow
(cg_dspy.workflows) and prints what it returned.

Exit status: 0 when every task finished, 1 when some task, input row or grade failed
(each is listed), 2 for unusable input or arguments (one line naming the file, line,
task and field), 3 when `optimize` stopped at --max-calls (the best program so far is
saved), 130 when interrupted (rerun the same command to resume). Tracebacks are for
real bugs, and only with --debug.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from cg_dspy.clbench import data
from cg_dspy.cli import commands
from cg_dspy.cli.arguments import parser
from cg_dspy.cli.console import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, say
from cg_dspy.core.files import OutputRefused
from cg_dspy.core.redact import printable
from cg_dspy.judge.typer import LMUnreachable
from cg_dspy.lms import patches
from cg_dspy.method.config import ProgramRefused
from cg_dspy.optimize.compile import DevFailed

USER_ERRORS = (data.InvalidInput, OSError, ValueError, OutputRefused, ProgramRefused)  # files, paths, values
# Offline and quiet: LiteLLM's bundled cost map instead of a download, and no usage
# telemetry from the libraries we load.
ENVIRONMENT = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


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
        return commands.COMMANDS[args.command](args)
    except KeyboardInterrupt:
        say("contextguard: stopped early. Rerun the same command to continue; finished rows are kept.")
        return EXIT_INTERRUPTED
    except USER_ERRORS as exc:
        if args.debug:
            raise
        for line in str(exc).splitlines() or [type(exc).__name__]:
            say(f"contextguard: {printable(line)}")
        return EXIT_USAGE
    except (DevFailed, LMUnreachable) as exc:  # the LMs answer nothing: nothing to report
        say(f"contextguard: {printable(str(exc))}")
        return EXIT_FAILED
    except Exception as exc:  # a bug of ours: say so in one line, the traceback with --debug
        if args.debug:
            raise
        say(f"contextguard: internal error ({type(exc).__name__}: {str(exc)[:300]}); rerun with --debug for "
            "the traceback")
        return EXIT_FAILED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


__all__ = ["main"]
