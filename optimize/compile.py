"""The compile entry point: a program, a train and a dev split, an optimizer recipe.

By default only the audit predictors (the generic one and each integrated specialist's)
and the revision are tuned (`tunable`); the others are hidden from the optimizer and
keep their instructions. The dev split is scored before and after with the paper's
judge (K = 3 votes per requirement by default, `dev_votes`), paired; a held-out `test`
split scores the untuned and the tuned program once at the end. Every LM call is
counted per role at the engine (`budget`), against an estimate (`simulate`) and an
optional cap: at the cap the optimizer stops and the best program it scored on the
whole dev set so far is kept (`candidates`). No MLflow here: `workflows.optimize`
tracks a run as one MLflow run.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import dspy

from cg_dspy.clbench.data import to_example
from cg_dspy.core.files import OutputRefused
from cg_dspy.judge.metric import RubricMetric
from cg_dspy.lms import patches, using
from cg_dspy.method import build_program
from cg_dspy.method.specialists import integrated_audits
from cg_dspy.optimize.budget import BudgetExhausted, Ledger, counted
from cg_dspy.optimize.candidates import Candidate, Candidates
from cg_dspy.optimize.recipes import RECIPES, compile_with
from cg_dspy.reports import statistics
from cg_dspy.reports.report import Paired, Rate
from cg_dspy.saved import check_output, program_from_state, save_program

# The audit (generic, and each integrated specialist's own, as the default policy runs
# them) and the revision: the prompts the paper's method turns on.
DEFAULT_TUNABLE = ("audit", *integrated_audits(), "revise")
DEV_VOTES = 3  # the paper's K: dev is judged as results are reported


def default_tunable(revision_mode: str = "rewrite") -> tuple[str, ...]:
    """What is tuned unless told: the audits and the revision stage the mode runs."""
    return DEFAULT_TUNABLE if revision_mode == "rewrite" else (*DEFAULT_TUNABLE[:-1], "edit")


@dataclass
class OptimizeResult:
    """The compiled program, its dev scores before and after (each task's outcome in
    `per_task`), the paired change between them (`dev_change`), the held-out test's
    paired result, and what the run called (per role) against its estimate."""

    program: dspy.Module
    dev_before: dict
    dev_after: dict
    settings: dict
    run_id: str | None = None
    judge_calls: int = 0
    calls: dict = field(default_factory=dict)
    estimate: dict | None = None
    capped: bool = False
    stopped: str | None = None  # why a capped run kept the program it kept
    test: dict | None = None
    candidates: list[Candidate] = field(default_factory=list)
    gepa: dict | None = None  # GEPA's candidates and Pareto front

    @property
    def dev_change(self) -> dict:
        return paired_dev(self.dev_before, self.dev_after)


class DevFailed(RuntimeError):
    """Every dev task failed before compiling (the task LM or the judge answers nothing), so
    nothing can be tuned: an optimizer would only spend its budget on errors and register
    untouched prompts."""


def evaluate(program, examples, metric: RubricMetric, *, lm, threads: int = 4) -> dict:
    """Dense rubric pass rate and strict task-solving rate (overall, per category), in %, with
    their 95% intervals, each task's outcome, and how many tasks failed with an error
    (scored 0 by DSPy, so counted here to be seen)."""
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
    return scores_of({ex.task_id: float(getattr(s, "score", s) or 0.0) for ex, _p, s in result.results},
                     {ex.task_id: ex.category for ex in examples}, errors)


def scores_of(fractions: dict[str, float], categories: dict[str, str], errors: list[str] = ()) -> dict:
    """Dev scores from each task's pass fraction (a task is solved when it is 1)."""
    per_cat: dict[str, list[bool]] = defaultdict(list)
    for tid, f in fractions.items():
        per_cat[categories[tid]].append(f == 1.0)
    solved = {tid: f == 1.0 for tid, f in fractions.items()}
    return {
        **Rate(len(solved), sum(solved.values())).to_dict(),
        "rubric_pass_rate": round(100 * sum(fractions.values()) / max(1, len(fractions)), 2),
        "rubric_pass_rate_ci95": statistics.bootstrap_mean_ci(list(fractions.values())),
        "by_category": {c: Rate(len(v), sum(v)).to_dict() for c, v in per_cat.items()},
        "errors": len(errors),
        **({"first_error": errors[0][:300]} if errors else {}),
        "per_task": {tid: {"solved": solved[tid], "pass_fraction": round(f, 4)} for tid, f in fractions.items()},
    }


def paired_dev(before: dict, after: dict) -> dict:
    """The tuned program against the untuned one on the same tasks: the difference of
    task-solving rates with its paired interval and McNemar p, and of rubric pass rates
    with a paired bootstrap interval."""
    common = sorted(set(before["per_task"]) & set(after["per_task"]))
    pairs = [(before["per_task"][t]["solved"], after["per_task"][t]["solved"]) for t in common]
    deltas = [after["per_task"][t]["pass_fraction"] - before["per_task"][t]["pass_fraction"] for t in common]
    out = Paired.of(pairs).to_dict()
    out.update(delta_rubric_pass_rate=round(100 * sum(deltas) / max(1, len(deltas)), 2),
               delta_rubric_pass_rate_ci95=statistics.bootstrap_mean_ci(deltas))
    return out


def check_splits(train, dev, test=None) -> None:
    """A task in two of train, dev and test is refused, naming it: held-out means held out."""
    named = {"train": {t.idx for t in train}, "dev": {t.idx for t in dev}, "test": {t.idx for t in test or []}}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        shared = sorted(named[a] & named[b])
        if shared:
            more = f" and {len(shared) - 5} more" if len(shared) > 5 else ""
            raise ValueError(f"the {a} and {b} splits share task(s) {', '.join(shared[:5])}{more}; they must not "
                             "overlap")


def gepa_log_dir(out: str | Path | None) -> Path | None:
    """Where GEPA keeps its candidates and state: beside the program (`P.json` -> `P.gepa/`),
    so the same command run again continues, even without DSPy's cache."""
    return None if out is None else Path(out).with_suffix(".gepa")


def optimize(**options) -> OptimizeResult:
    """Compile and score (see `prepare`), with no MLflow: `workflows.optimize` tracks it."""
    return prepare(**options).run()


def prepare(
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
    tunable: tuple[str, ...] | None = None,
    layout: str = "chat",
    policy: dict | None = None,
    revision_mode: str = "rewrite",
    threads: int = 4,
    out: str | Path | None = None,
    force: bool = False,
    inputs: tuple = (),
    dev_votes: int = DEV_VOTES,
    test=None,
    max_calls: int | None = None,
    estimate: dict | None = None,
    progress: bool = False,
    params: dict | None = None,
) -> _Run:
    """Everything checked before any LM call, and the run ready: compile `method` with
    `optimizer` on `train`, score `dev` before and after (and `test` once each at the
    end), spending at most `max_calls` LM calls; its `settings` are what a tracked run
    logs as params."""
    patches.install()
    if optimizer not in RECIPES:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose from {sorted(RECIPES)}")
    if dev_votes < 1 or dev_votes % 2 == 0:
        raise ValueError(f"dev votes {dev_votes}: an odd K of at least 1 (an even K can tie)")
    if max_calls is not None and max_calls < 1:
        raise ValueError(f"max calls {max_calls}: at least 1")
    check_splits(train, dev, test)
    if out:
        check_output(out, force=force, inputs=inputs)  # before any LM call
        log_dir = gepa_log_dir(out)
        if optimizer == "gepa" and (log_dir.is_symlink() or (log_dir.exists() and not log_dir.is_dir())):
            raise OutputRefused(f"{log_dir}: GEPA keeps its state there, and it is a link or a file; remove it")
    program = build_program(method, ablate, layout=layout, policy=policy, revision_mode=revision_mode)
    tunable = default_tunable(revision_mode) if tunable is None else tuple(tunable)
    names = [n for n, _ in program.named_predictors()]
    unknown = set(tunable) - set(names)
    if unknown:
        raise ValueError(f"tunable stages {sorted(unknown)} do not exist; the program has {names}")
    ledger = Ledger(cap=max_calls, estimate=(estimate or {}).get("calls", {}).get("total"), progress=progress)
    try:
        lms = {"task": counted(task_lm, "task", ledger), "judge": counted(judge_lm, "judge", ledger),
               "reflection": counted(reflection_lm or task_lm, "reflection", ledger)}
    except ValueError:
        if max_calls is not None:
            raise
        lms = {"task": task_lm, "judge": judge_lm, "reflection": reflection_lm or task_lm}  # not countable
    run = _Run(optimizer=optimizer, budget=budget, program=program, names=names, tunable=tunable,
               train=[to_example(t) for t in train], dev=[to_example(t) for t in dev],
               test=[to_example(t) for t in test] if test else None, lms=lms, ledger=ledger, threads=threads,
               dev_votes=dev_votes, log_dir=gepa_log_dir(out) if optimizer == "gepa" else None,
               out=out, force=force, inputs=inputs, estimate=estimate)
    run.settings = {"optimizer": optimizer, "budget": budget, "optimizer_settings": run.recipe_settings,
                    "method": method, "ablate": list(ablate), "tunable": list(tunable), "program": program.config(),
                    "train_size": len(train), "dev_size": len(dev), "test_size": len(test or []),
                    "dev_votes": dev_votes, "max_calls": max_calls, **(params or {})}
    return run


@dataclass
class _Run:
    """One optimize run's work, without MLflow: score dev, compile, score dev and test."""

    optimizer: str
    budget: str
    program: dspy.Module
    names: list[str]
    tunable: tuple[str, ...]
    train: list
    dev: list
    test: list | None
    lms: dict
    ledger: Ledger
    threads: int
    dev_votes: int
    log_dir: Path | None
    out: str | Path | None = None
    force: bool = False
    inputs: tuple = ()
    estimate: dict | None = None
    on_candidate: object = None  # callable(Candidate): each program scored on the whole dev set
    settings: dict = field(default_factory=dict)

    def __post_init__(self):
        self.untuned = copy.deepcopy(self.program)  # what the held-out test compares against
        self.metric = RubricMetric(self.lms["judge"], votes=self.dev_votes)
        self.feedback_metric = RubricMetric(self.lms["judge"], votes=self.dev_votes, feedback=True,
                                            memo=self.metric.memo)
        self.tracker = Candidates(self.program, [ex.task_id for ex in self.dev],
                                  on_candidate=lambda c: self._heard(c))
        self.recipe, self.recipe_settings = RECIPES[self.optimizer](
            self.feedback_metric if self.optimizer == "gepa" else self.metric, self.budget, threads=self.threads,
            reflection_lm=self.lms["reflection"], prompt_lm=self.lms["reflection"], task_lm=self.lms["task"],
            train_size=len(self.train), log_dir=self.log_dir, callbacks=[self.tracker.gepa_callback(self.dev)])

    def _heard(self, candidate: Candidate) -> None:
        best = self.tracker.best()
        self.ledger.best, self.ledger.candidates = (best.score if best else None), len(self.tracker.found)
        if callable(self.on_candidate):
            self.on_candidate(candidate)

    def _evaluate(self, program, examples, metric=None) -> dict:
        return evaluate(program, examples, metric or self.metric, lm=self.lms["task"], threads=self.threads)

    def run(self) -> OptimizeResult:
        """Score dev, compile, score dev (and test); the program saved to `out`."""
        result = self._work()
        result.settings, result.estimate = self.settings, self.estimate
        if self.out:
            save_program(result.program, self.out, force=self.force, inputs=self.inputs)
        return result

    def _work(self) -> OptimizeResult:
        with dspy.context(callbacks=[*(dspy.settings.callbacks or []), self.tracker]):
            try:
                before = self._evaluate(self.program, self.dev)
            except BudgetExhausted:
                return self._capped(None, "the cap was reached while the untuned program was scored on dev")
            if self.dev and before["errors"] == len(self.dev):
                raise DevFailed(f"every dev task ({len(self.dev)}) failed before compiling, nothing was tuned; "
                                f"the first: {before['first_error']}")
            if hasattr(self.program, "frozen"):
                self.program.frozen = frozenset(set(self.names) - set(self.tunable))
            try:
                with using(self.lms["task"]):
                    compiled = compile_with(self.optimizer, self.recipe, self.program, self.train, self.dev)
                after = self._evaluate(_unfrozen(compiled), self.dev)
            except BudgetExhausted:
                return self._capped(before, "the cap was reached while the optimizer ran")
        result = OptimizeResult(compiled, before, after, {}, judge_calls=self.metric.judge_calls
                                + self.feedback_metric.judge_calls, candidates=list(self.tracker.found),
                                gepa=_gepa_summary(compiled))
        if self.test:
            result.test = self._test(compiled)
        result.calls = self.ledger.as_dict()
        return result

    def _test(self, compiled) -> dict:
        """Both programs once on the held-out tasks, with the paper's judge (K = 3, strict)."""
        metric = RubricMetric(self.lms["judge"], votes=DEV_VOTES,
                              memo=self.metric.memo if self.dev_votes == DEV_VOTES else None)
        try:
            before = self._evaluate(_unfrozen(self.untuned), self.test, metric)
            after = self._evaluate(compiled, self.test, metric)
        except BudgetExhausted:
            return {"scored": False, "why": "the cap was reached before the test split was scored"}
        strip = lambda s: {k: v for k, v in s.items() if k != "per_task"}  # noqa: E731
        return {"scored": True, "tasks": len(self.test), "before": strip(before), "after": strip(after),
                "change": paired_dev(before, after)}

    def _capped(self, before: dict | None, why: str) -> OptimizeResult:
        """The best program scored on the whole dev set so far (the untuned one if none beat
        it), with the score it was given; nothing more is called."""
        best = self.tracker.best()
        categories = {ex.task_id: ex.category for ex in self.dev}
        if best is None:
            program, after = _unfrozen(self.program), before
            kept = "the untuned program (no candidate was scored on the whole dev set)"
        else:
            program = program_from_state(best.state, source=f"candidate {best.index}")
            after = scores_of(best.scores, categories)
            kept = f"candidate {best.index} ({best.source}), the best scored on the whole dev set"
        result = OptimizeResult(program, before or after or {}, after or {}, {}, capped=True,
                                stopped=f"{why}; kept {kept}",
                                judge_calls=self.metric.judge_calls + self.feedback_metric.judge_calls,
                                candidates=list(self.tracker.found),
                                test={"scored": False, "why": "the cap was reached"} if self.test else None)
        result.calls = self.ledger.as_dict()
        return result


def _unfrozen(program):
    if hasattr(program, "frozen"):
        program.frozen = frozenset()  # saved programs hold every stage
    return program


def _gepa_summary(compiled) -> dict | None:
    """GEPA's candidates (instructions per stage), their dev scores, parents and Pareto front."""
    details = getattr(compiled, "detailed_results", None)
    if details is None:
        return None
    front = set().union(*details.per_val_instance_best_candidates.values()) \
        if details.per_val_instance_best_candidates else set()
    return {"best": details.best_idx, "total_metric_calls": details.total_metric_calls,
            "candidates": [{"index": i, "dev_score": details.val_aggregate_scores[i], "parents": details.parents[i],
                            "on_pareto_front": i in front,
                            "instructions": {n: p.signature.instructions for n, p in c.named_predictors()}}
                           for i, c in enumerate(details.candidates)]}
