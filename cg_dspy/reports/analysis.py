"""The paper's analyses over graded rows: pure functions, no I/O.

Task-solving rate under strict all-requirements scoring (Eq. 10-12), breakdowns by
category, sub-category and input length (Figure 3-4), the near-miss distribution and
migration (Appendix H), requirement-level repair and regression (Appendix I) and
judge stability (Table 5). Every rate carries its 95% interval and every comparison of
two runs its paired difference, interval and McNemar p (`statistics`); repeated runs
of one method are summarized as mean ± std. Percentages are numbers in 0-100.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from cg_dspy.clbench.lengths import LENGTH_BINS, length_bin, token_length
from cg_dspy.clbench.rows import GradedRow, graded_rows
from cg_dspy.core.cost import cost_totals
from cg_dspy.judge.types import RUBRIC_TYPES, rubric_type
from cg_dspy.reports import statistics
from cg_dspy.reports.report import Comparison, Paired, Rate, Repeats, Report, RunSummary, pct
from cg_dspy.reports.runs import label_files

NEAR_MISS_BINS = ("0", "1", "2-3", "4-8", ">8")
def near_miss_bin(n_failed: int) -> str:
    if n_failed <= 1:
        return str(n_failed)
    if n_failed <= 3:
        return "2-3"
    if n_failed <= 8:
        return "4-8"
    return ">8"


def _rate_table(rows: list[GradedRow], key) -> dict[str, Rate]:
    groups: dict[str, list[GradedRow]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return {name: Rate(len(g), sum(r.solved for r in g)) for name, g in sorted(groups.items())}


def pass_fraction(row: GradedRow) -> float:
    """The share of a task's requirements satisfied (0 for a task without rubrics)."""
    flags = row.satisfied
    return sum(flags) / len(flags) if flags else 0.0


def _sub_categories(rows: list[GradedRow]) -> dict[str, Rate]:
    """TSR per sub-category, each tagged with its macro-category (Figure 3's grouping); a
    name found under two categories (e.g. a missing one, "unknown") is one row per category."""
    owners: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        owners[r.metadata.sub_category].add(r.metadata.context_category)

    def key(r: GradedRow) -> str:
        sub = r.metadata.sub_category
        return sub if len(owners[sub]) == 1 else f"{sub} ({r.metadata.context_category})"

    owner = {key(r): r.metadata.context_category for r in rows}
    return {sub: Rate(cell.tasks, cell.solved, owner[sub]) for sub, cell in _rate_table(rows, key).items()}


def rubric_type_failure(rows, typer=rubric_type) -> dict[str, float | None]:
    """Failure rate per requirement type, task-averaged within each type (Table 2);
    `typer(rubric)` gives a rubric's type or None (untyped rubrics count nowhere)."""
    per_type: dict[str, list[float]] = defaultdict(list)
    for r in graded_rows(rows):
        by_type: dict[str, list[bool]] = defaultdict(list)
        for rubric, ok in zip(r.rubrics, r.satisfied):
            t = typer(rubric)
            if t:
                by_type[t].append(ok)
        for t, oks in by_type.items():
            per_type[t].append(sum(not ok for ok in oks) / len(oks))
    return {t: pct(sum(per_type[t]), len(per_type[t])) for t in RUBRIC_TYPES}


def run_summary(rows, typer=rubric_type, bin_of=None) -> RunSummary:
    """Every per-run figure of the report for one graded file; `bin_of(row)` gives a
    row's length bin (computed once per row by `report`)."""
    rows = graded_rows(rows)
    bin_of = bin_of or (lambda r: length_bin(token_length(r.messages)))
    near = dict.fromkeys(NEAR_MISS_BINS, 0)
    for r in rows:
        near[near_miss_bin(r.failed)] += 1
    by_length = _rate_table(rows, bin_of)
    fractions = [pass_fraction(r) for r in rows]
    return RunSummary(
        rate=Rate(len(rows), sum(r.solved for r in rows)),
        rubric_pass_rate=pct(sum(fractions), len(fractions)),
        rubric_pass_rate_ci95=statistics.bootstrap_mean_ci(fractions),
        by_category=_rate_table(rows, lambda r: r.metadata.context_category),
        by_sub_category=_sub_categories(rows),
        by_length_bin={b: by_length[b] for b in LENGTH_BINS if b in by_length},
        near_miss=near,
        rubric_type_failure=rubric_type_failure(rows, typer),
        score_disagrees_with_statuses=sum(r.inconsistent for r in rows))


class NoCommonTasks(ValueError):
    """Two runs to compare share no task: there is nothing to pair."""


def compare(before, after, *, labels: tuple[str, str] = ("before", "after"), bin_of=None) -> Comparison:
    """Before -> after over the tasks both runs hold (Appendix H-I): the paired difference
    of task-solving rates (interval, McNemar p) overall and per length bin, the rubric
    pass rate's paired bootstrap difference, the migration matrix and repair/regression.
    Tasks only one run holds are left out and counted; none in common is an error."""
    b_rows = {r.task_id: r for r in graded_rows(before)}
    a_rows = {r.task_id: r for r in graded_rows(after)}
    common = sorted(set(b_rows) & set(a_rows))
    if not common:
        raise NoCommonTasks("the two runs share no task id, so they cannot be compared (are they runs over the same "
                            "tasks?)")
    bin_of = bin_of or (lambda r: length_bin(token_length(r.messages)))
    migration = {x: dict.fromkeys(NEAR_MISS_BINS, 0) for x in NEAR_MISS_BINS}
    repairs = regressions = changed = total = x0 = x1 = 0
    pairs, by_bin, fraction_deltas = [], defaultdict(list), []
    for rid in common:
        before_row, after_row = b_rows[rid], a_rows[rid]
        m = len(before_row.rubrics)
        xs = (before_row.satisfied[:m] + [False] * m)[:m]
        ys = (after_row.satisfied[:m] + [False] * m)[:m]
        migration[near_miss_bin(xs.count(False))][near_miss_bin(ys.count(False))] += 1
        pairs.append((before_row.solved, after_row.solved))
        by_bin[bin_of(before_row)].append(pairs[-1])
        fraction_deltas.append(pass_fraction(after_row) - pass_fraction(before_row))
        for x, y in zip(xs, ys):
            total += 1
            x1 += x
            x0 += not x
            repairs += (not x) and y
            regressions += x and not y
            changed += x != y
    overall = Paired.of(pairs)
    repair_p, regression = pct(repairs, x0), pct(regressions, x1)
    return Comparison(
        before=labels[0], after=labels[1], paired=overall,
        tasks_only_before=len(set(b_rows) - set(a_rows)), tasks_only_after=len(set(a_rows) - set(b_rows)),
        delta_rubric_pass_rate=pct(sum(fraction_deltas), len(fraction_deltas)),
        delta_rubric_pass_rate_ci95=statistics.bootstrap_mean_ci(fraction_deltas),
        by_length_bin={b: Paired.of(by_bin[b]) for b in LENGTH_BINS if b in by_bin},
        migration=migration,
        repair={"preserved_solved": overall.both, "net_solved_gain": overall.newly - overall.broken,
                "change_rate": pct(changed, total), "repair_probability": repair_p, "regression_risk": regression,
                "positive_change_precision": pct(repairs, changed),
                "benefit_risk_ratio": round(repair_p / regression, 2) if repair_p is not None and regression else None,
                "net_requirement_gain": pct(repairs - regressions, total)})


def _agreement(votes: list[bool]) -> tuple[float, float]:
    """(pairwise agreement among votes, agreement of votes with their majority)."""
    k = len(votes)
    pairs = list(combinations(votes, 2))
    single = sum(a == b for a, b in pairs) / len(pairs) if pairs else 1.0
    label = sum(votes) > k / 2
    return single, sum(v == label for v in votes) / k


def full_votes(row: GradedRow) -> int | None:
    """K when the row was graded with every vote drawn (early stop off, as recorded by
    `grade_file`) and holds exactly K votes for each of its requirements, else None:
    early-stopped votes keep all K only where the first ones disagreed, so they would bias
    agreement downwards, and so would a row that lost some."""
    run = ((row.model_extra or {}).get("cg_dspy") or {}).get("run") or {}
    k = run.get("votes")
    if run.get("early_stop") is not False or not isinstance(k, int) or k < 2 or not row.rubrics:
        return None
    votes = row.votes or []
    return k if len(votes) == len(row.rubrics) and all(len(v) == k for v in votes) else None


def judge_stability(rows) -> dict | None:
    """Single-vote and majority-vote agreement, requirement and task level (Table 5), over
    the rows graded with every vote drawn (`full_votes`); None when there are none."""
    rows = graded_rows(rows)
    ks = [full_votes(r) for r in rows]
    if not any(ks):
        return None
    k = max(filter(None, ks))  # one K per table; rows of another K are counted as left out
    votes = [[[v == "yes" for v in vs] for vs in r.votes] for r, rk in zip(rows, ks) if rk == k]
    req = [_agreement(v) for vs in votes for v in vs]
    tasks = [_agreement([all(v[i] for v in vs) for i in range(k)]) for vs in votes]

    def level(items: list[tuple[float, float]]) -> dict:
        return {
            "instances": len(items),
            "single_vote_agreement": pct(sum(s for s, _ in items), len(items)),
            "majority_vote_agreement": pct(sum(m for _, m in items), len(items)),
        }

    return {"votes": k, "requirement": level(req), "task": level(tasks), "tasks_left_out": len(rows) - len(votes)}


STABILITY_HOW = "grade with `contextguard eval --no-early-stop` (or `contextguard bench --judge-stability`)"


def stability_reason(runs: dict[str, list[GradedRow]], measured: dict) -> str | None:
    """Why Table 5 is missing for some or all runs, and how to measure it."""
    early = [n for n, rows in runs.items() if n not in measured and any(r.votes for r in rows)]
    unvoted = [n for n, rows in runs.items() if n not in measured and n not in early]
    parts = []
    if early:
        parts.append(f"{', '.join(early)}: the votes were not drawn to K for every requirement (early stop draws "
                     "the third vote only when the first two disagree; K = 1 has no second vote), so agreement "
                     "over them would be biased; no stability is reported")
    partial = [f"{n} ({s['tasks_left_out']} tasks left out: early-stopped, incomplete or another K)"
               for n, s in measured.items() if s["tasks_left_out"]]
    if partial:
        parts.append(f"stability over the tasks with every vote only: {', '.join(partial)}")
    if unvoted and not measured:
        parts.append(f"{', '.join(unvoted)}: no per-requirement votes recorded")
    return "; ".join(parts) + f". To measure judge stability, {STABILITY_HOW}." if parts else None


def cost_summary(rows) -> dict | None:
    """LM calls, tokens and seconds per task of the generating method (None if unrecorded)."""
    costed = [r.cost for r in graded_rows(rows) if r.cost]
    if not costed:
        return None
    n = len(costed)
    totals = cost_totals(c.model_dump() for cost in costed for c in cost.stages.values())
    seconds = [cost.seconds for cost in costed if cost.seconds is not None]
    return {
        "tasks": n,
        "lm_calls_per_task": round(totals["calls"] / n, 3),
        "cached_answers_per_task": round(totals["cached"] / n, 3),
        "prompt_tokens_per_task": round(totals["prompt_tokens"] / n, 1),
        "prefilled_tokens_per_task": round((totals["prompt_tokens"] - totals["cached_prompt_tokens"]) / n, 1),
        "completion_tokens_per_task": round(totals["completion_tokens"] / n, 1),
        "truncated_replies_per_task": round(totals["truncated"] / n, 3),
        "seconds_per_task": round(sum(seconds) / len(seconds), 3) if seconds else None,
    }


def report(runs: dict[str, list], *, typer=rubric_type, typer_name: str = "keyword",
           repeats: dict[str, list[list]] | None = None, notes: list[str] = (),
           pairs: list[tuple[str, str]] | None = None) -> Report:
    """The report: every run; its paired comparisons (`pairs`, by default the first run
    against the second when there are two); repeats (mean ± std) for runs that have
    them; judge stability for runs graded with every vote drawn (else why not); and the
    generation's cost when the graded rows carry it."""
    runs = {name: graded_rows(rows) for name, rows in runs.items()}
    bins: dict[int, str] = {}

    def bin_of(row: GradedRow) -> str:  # every conversation tokenized once
        if id(row) not in bins:
            bins[id(row)] = length_bin(token_length(row.messages))
        return bins[id(row)]

    names = list(runs)
    if pairs is None:
        pairs = [(names[0], names[1])] if len(names) == 2 else []
    stability = {name: judge_stability(rows) for name, rows in runs.items()}
    stability = {k: v for k, v in stability.items() if v is not None}
    cost = {name: cost_summary(rows) for name, rows in runs.items()}
    return Report(
        runs={name: run_summary(rows, typer, bin_of) for name, rows in runs.items()},
        comparisons=[compare(runs[b], runs[a], labels=(b, a), bin_of=bin_of) for b, a in pairs],
        repeats={name: repeat_summary([graded_rows(r) for r in rows]) for name, rows in (repeats or {}).items()},
        judge_stability=stability or None, judge_stability_reason=stability_reason(runs, stability),
        cost={k: v for k, v in cost.items() if v is not None}, rubric_typer=typer_name, notes=list(notes))


def repeat_summary(repeats: list[list[GradedRow]]) -> Repeats:
    """Repeats of one run: each one's task-solving rate, overall and per category."""
    rates = [100.0 * sum(r.solved for r in rows) / len(rows) for rows in repeats if rows]
    categories = sorted({r.metadata.context_category for rows in repeats for r in rows})
    by_category = {}
    for cat in categories:
        per_run = [[r for r in rows if r.metadata.context_category == cat] for rows in repeats]
        by_category[cat] = [100.0 * sum(r.solved for r in rows) / len(rows) for rows in per_run if rows]
    return Repeats(rates, len(repeats[0]) if repeats else 0, by_category)


def report_files(files: dict[str, list], **options) -> Report:
    """`report` over graded files: runs by label, repeats summarized, notes kept."""
    labelled = label_files(files)
    return report(labelled.runs, repeats=labelled.repeats, notes=labelled.notes, **options)
