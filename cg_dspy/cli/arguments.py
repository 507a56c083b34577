"""The `contextguard` command's arguments: what each subcommand takes, with numbers
checked by argparse (exit 2 before any work), and the LM settings they make."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cg_dspy.core.messages import CATEGORIES, LIFE_CATEGORIES
from cg_dspy.judge.voting import PROTOCOLS
from cg_dspy.lms import DEFAULT_TIMEOUT, LMSettings
from cg_dspy.lms.build import REASONING_EFFORTS
from cg_dspy.lms.endpoint import STRUCTURED_OUTPUT
from cg_dspy.lms.replicas import endpoints
from cg_dspy.method import LAYOUTS, METHODS, method_names
from cg_dspy.method.program import ABLATIONS, MAX_ROUNDS, REVISION_MODES
from cg_dspy.method.specialists import DEFAULT_POLICY, Policy, parse_policy
from cg_dspy.optimize.compile import DEFAULT_TUNABLE
from cg_dspy.optimize.recipes import BUDGETS, RECIPES

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


def policy_file(path: str) -> Policy:
    """`--policy FILE`: a JSON object of category -> [kind, mode] (or null: no specialist),
    laid over the paper's policy for CL-bench's four categories."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise argparse.ArgumentTypeError(f"{path}: not JSON ({exc})") from None
    try:
        parsed = parse_policy(body, path)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    unknown = sorted(set(parsed) - {*CATEGORIES, *LIFE_CATEGORIES})
    if unknown:  # a category of another dataset, or a typo that would leave the real one on the default
        print(f"warning: {path}: {', '.join(map(repr, unknown))} is no category of CL-bench or CLBench-life; "
              "only tasks of exactly that category get its entry", file=sys.stderr)
    merged = {**DEFAULT_POLICY, **parsed}
    return None if merged == DEFAULT_POLICY else merged  # the paper's policy, said as in a run without --policy


def add_lm_flags(p: argparse.ArgumentParser, prefix: str = "", role: str = "task") -> None:
    env = "CG_JUDGE_" if prefix else "CG_"
    p.add_argument(f"--{prefix}model", help=f"LiteLLM model string for the {role} LM (env {env}MODEL); "
                   "default: the embedded local model")
    p.add_argument(f"--{prefix}api-base", action="append",
                   help=f"OpenAI-compatible endpoint URL (env {env}API_BASE); give it more than once (or a "
                   "comma-separated list) for replicas of one model: each task is pinned to one of them")
    p.add_argument(f"--{prefix}temperature", type=float, help=f"sampling temperature (env {env}TEMPERATURE)")
    p.add_argument(f"--{prefix}max-tokens", type=positive_int, help=f"max output tokens per call (env "
                   f"{env}MAX_TOKENS); default: the server's own (the embedded model: 384)")
    p.add_argument(f"--{prefix}reasoning-effort", choices=REASONING_EFFORTS,
                   help=f"sent as `reasoning_effort` to a reasoning model (vLLM, SGLang, OpenAI; env "
                   f"{env}REASONING_EFFORT); default: not sent, the server decides")
    p.add_argument(f"--{prefix}structured-output", choices=STRUCTURED_OUTPUT, default="auto",
                   help="how typed stages ask an OpenAI-compatible server for JSON: auto tries json_schema, then "
                   "json_object with a schema, then none, and keeps what the server accepts")
    p.add_argument(f"--{prefix}item-limit", type=positive_int, help="items per audit/checker list the output "
                   "schema allows (default 24; the embedded model: 2)")
    p.add_argument(f"--{prefix}item-chars", type=positive_int, help="characters per audit/checker item (default "
                   "500, also the most a schema bound carries: llama.cpp's grammar compiler fails on longer ones; "
                   "the embedded model: 100)")


def lm_settings(args, prefix: str = "") -> LMSettings:
    attr = prefix.replace("-", "_")
    given = getattr(args, f"{attr}api_base")
    for base in endpoints(",".join(given))[1] if given else ():
        print(f"warning: --{prefix}api-base {base} is listed twice; it is one replica", file=sys.stderr)
    return LMSettings.from_env(
        "CG_JUDGE_" if prefix else "CG_",
        model=getattr(args, f"{attr}model"),
        api_base=",".join(given) if given else None,
        temperature=getattr(args, f"{attr}temperature"),
        max_tokens=getattr(args, f"{attr}max_tokens"),
        structured_output=getattr(args, f"{attr}structured_output"),
        item_limit=getattr(args, f"{attr}item_limit"),
        item_chars=getattr(args, f"{attr}item_chars"),
        reasoning_effort=getattr(args, f"{attr}reasoning_effort"),
        cache=not args.no_cache,
        num_retries=args.retries,
        timeout=args.timeout,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="contextguard", description="ContextGuard on CL-bench, in DSPy.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)

    def program_flags(sp):
        sp.add_argument("--layout", choices=LAYOUTS, default="chat",
                        help="chat: every stage after the draft continues the draft's chat, so a prefix-caching "
                        "server prefills only the stage's own text (default); inline: the stage is appended to "
                        "the task's last message")
        sp.add_argument("--policy", type=policy_file, metavar="FILE",
                        help="JSON: category -> [specialist kind, mode] (or null for none), over the paper's "
                        "policy for CL-bench's categories; any other category runs the generic audit alone")

    def revision_mode(sp):
        sp.add_argument("--revision-mode", choices=REVISION_MODES, default="rewrite",
                        help="rewrite: the paper's protected revision returns the whole answer (default); edit: it "
                        "returns targeted edits (replace a passage, insert after an anchor, append), so text no fix "
                        "item names stays byte for byte and the revision writes a fraction of the tokens")

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
            add_lm_flags(sp)
        if judge_flags:
            add_lm_flags(sp, "judge-", "judge")
        if judge_flags and grading:
            sp.add_argument("--votes", type=odd_votes, default=3, help="judge votes per requirement (odd K, default 3)")
            sp.add_argument("--protocol", choices=PROTOCOLS, default="rubric",
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
    program_flags(r)
    revision_mode(r)

    e = sub.add_parser("eval", help="judge a result file with the rubric judge")
    e.add_argument("results", help="result JSONL written by `run` (or any CL-bench results file)")
    e.add_argument("--out", required=True, help="graded JSONL (resumed if it exists)")
    common(e, judge_flags=True, task_flags=False)
    output(e)

    rp = sub.add_parser("report", help="tables (and plots) from graded files")
    rp.add_argument("graded", nargs="+", help="graded JSONL; with two runs, the first is 'before'")
    rp.add_argument("--format", choices=("markdown", "json"), default="markdown")
    rp.add_argument("--plots", help="directory for PNG figures")
    rp.add_argument("--html", help="write the report as one self-contained HTML page (tables and figures)")
    rubric_types(rp)
    common(rp, judge_flags=True, task_flags=False, grading=False)

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
    program_flags(b)

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
    o.add_argument("--tunable", nargs="+",
                   help=f"predictors the optimizer may change (default: {' '.join(DEFAULT_TUNABLE)}; with "
                        "--revision-mode edit, edit in place of revise)")
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
    program_flags(o)
    revision_mode(o)

    c = sub.add_parser("compare", help="prompt versions from the Prompt Registry side by side, and the runs")
    c.add_argument("--experiment", default="contextguard")
    c.add_argument("--stage", nargs="*", help="stages to show (default: every stage with a tuned version)")
    c.add_argument("--a", type=positive_int, help="version to diff from (default: the base version)")
    c.add_argument("--b", type=positive_int, help="version to diff to (default: the best by dev task-solving rate)")
    c.add_argument("--tracking-uri")
    c.add_argument("--format", choices=("markdown", "json"), default="markdown")

    s = sub.add_parser("split", help="write a deterministic train/dev/test split manifest")
    s.add_argument("tasks")
    s.add_argument("--out", required=True)
    s.add_argument("--fractions", default="0.2,0.2,0.6")
    s.add_argument("--seed", default="cg-dspy-1")
    s.add_argument("--force", action="store_true", help="replace an existing file that is not a manifest")
    s.add_argument("--register", action="store_true",
                   help="also register each split as an MLflow evaluation dataset (inputs: conversation, category; "
                   "expectations: rubrics), what mlflow.genai.evaluate and MLflow's evaluation UI read")
    s.add_argument("--experiment", default="contextguard", help="MLflow experiment of the datasets (--register)")
    s.add_argument("--tracking-uri", help="MLflow store of the datasets (--register; env MLFLOW_TRACKING_URI; "
                   "default sqlite:///mlflow.db)")
    discordance(s)
    return p
