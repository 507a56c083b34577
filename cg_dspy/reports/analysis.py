"""The paper's analyses over graded rows: pure functions, no I/O.

Task-solving rate under strict all-requirements scoring (Eq. 10-12), breakdowns by
category, sub-category and input length (Figure 3-4), the near-miss distribution and
migration (Appendix H), requirement-level repair and regression (Appendix I) and
judge stability (Table 5). Every rate carries its 95% interval and every comparison of
two runs its paired difference, interval and McNemar p (`statistics`); repeated runs
of one method are summarized as mean ± std. Percentages are numbers in 0-100.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

from cg_dspy.evaluation.data import LENGTH_BINS, length_bin, token_length
from cg_dspy.evaluation.rows import GradedRow, graded_rows
from cg_dspy.method.stages import cost_totals
from cg_dspy.reports import statistics

NEAR_MISS_BINS = ("0", "1", "2-3", "4-8", ">8")
RUBRIC_TYPES = (
    "format/lexical",
    "procedure/agent",
    "calc/verify/standards",
    "conditional rules",
    "style/audience/persona",
)
# Keyword cues per requirement type; a rubric takes the type with the most cues
# (ties go to the earlier type), and a rubric with no cue is left untyped. Agreement with
# hand labels of 67 real CL-bench rubrics: tests/test_rubric_types.py (and the README).
_TYPE_CUES = {
    "format/lexical": r"format|bullet|numbered|list\b|listed|table|json|xml|heading|section|paragraph|bold|italic|"
    r"markdown|words?\b|characters?|sentence|begin|start with|end with|ends? with|conclude with|capital|"
    r"quote|exactly|phrase|label|length|\blines?\b|glossary|disclaimer|unique .*terms|order the|citations?",
    "procedure/agent": r"step|procedure|workflow|route|routing|agent|hand-?off|escalat|\blog\b|logs|"
    r"sequence|gate|checklist|protocol|stop and|before|after|then\b|follow-?up|continu|"
    r"confirm the user",
    "calc/verify/standards": r"calculat|compute|total|sum\b|average|mean\b|percent|%|estimate|\bunits?\b|"
    r"verif|standard|formula|value|accura|precis|quantitativ|mathemat|numer|evidence|supported by|"
    r"\bdata\b|principle|specification|exact text|unable to find|distinguish",
    "conditional rules": r"\bif\b|unless|except|\bwhen\b|only if|rule|condition|exempt|appl(y|ies)|"
    r"threshold|not approved|must not|never|eligib",
    "style/audience/persona": r"tone|style|audience|persona|friendly|formal|plain language|slang|"
    r"empath|polite|voice|\brole\b|teenager|beginner|child|warm|encourag|concise|emoji|euphemis|analog|"
    r"everyday language|accessible|sound confident|sadness|acknowledge|\bAI\b|advanced knowledge|"
    r"you are an? |simple to complex|assistant that",
}
_CUE_RE = {t: re.compile(p, re.IGNORECASE) for t, p in _TYPE_CUES.items()}


def rubric_type(rubric: str) -> str | None:
    """The requirement type a rubric tests, by keyword cues (None when no cue matches)."""
    hits = {t: len(_CUE_RE[t].findall(rubric)) for t in RUBRIC_TYPES}
    best = max(RUBRIC_TYPES, key=lambda t: hits[t])
    return best if hits[best] else None


def near_miss_bin(n_failed: int) -> str:
    if n_failed <= 1:
        return str(n_failed)
    if n_failed <= 3:
        return "2-3"
    if n_failed <= 8:
        return "4-8"
    return ">8"


def _pct(num: float, den: float) -> float | None:
    return round(100.0 * num / den, 2) if den else None


def rate_cell(solved: int, tasks: int) -> dict:
    """Tasks, solved, the task-solving rate and its 95% (Wilson) interval."""
    return {"tasks": tasks, "solved": solved, "task_solving_rate": _pct(solved, tasks),
            "task_solving_rate_ci95": statistics.rate_ci(solved, tasks)}


def _rate_table(rows: list[GradedRow], key) -> dict[str, dict]:
    groups: dict[str, list[GradedRow]] = defaultdict(list)
    for r in rows:
        groups[key(r)].append(r)
    return {name: rate_cell(sum(r.solved for r in g), len(g)) for name, g in sorted(groups.items())}


def pass_fraction(row: GradedRow) -> float:
    """The share of a task's requirements satisfied (0 for a task without rubrics)."""
    flags = row.satisfied
    return sum(flags) / len(flags) if flags else 0.0


def _sub_categories(rows: list[GradedRow]) -> dict[str, dict]:
    """TSR per sub-category, each tagged with its macro-category (Figure 3's grouping); a
    name found under two categories (e.g. a missing one, "unknown") is one row per category."""
    owners: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        owners[r.metadata.sub_category].add(r.metadata.context_category)

    def key(r: GradedRow) -> str:
        sub = r.metadata.sub_category
        return sub if len(owners[sub]) == 1 else f"{sub} ({r.metadata.context_category})"

    owner = {key(r): r.metadata.context_category for r in rows}
    return {sub: {**cell, "category": owner[sub]} for sub, cell in _rate_table(rows, key).items()}


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
    return {t: _pct(sum(per_type[t]), len(per_type[t])) for t in RUBRIC_TYPES}


def run_summary(rows, typer=rubric_type, bin_of=None) -> dict:
    """Every per-run figure of the report for one graded file; `bin_of(row)` gives a
    row's length bin (computed once per row by `report`)."""
    rows = graded_rows(rows)
    bin_of = bin_of or (lambda r: length_bin(token_length(r.messages)))
    near = dict.fromkeys(NEAR_MISS_BINS, 0)
    for r in rows:
        near[near_miss_bin(r.failed)] += 1
    by_length = _rate_table(rows, bin_of)
    fractions = [pass_fraction(r) for r in rows]
    summary = {
        **rate_cell(sum(r.solved for r in rows), len(rows)),
        "rubric_pass_rate": _pct(sum(fractions), len(fractions)),
        "rubric_pass_rate_ci95": statistics.bootstrap_mean_ci(fractions),
        "by_category": _rate_table(rows, lambda r: r.metadata.context_category),
        "by_sub_category": _sub_categories(rows),
        "by_length_bin": {b: by_length[b] for b in LENGTH_BINS if b in by_length},
        "near_miss": near,
        "rubric_type_failure": rubric_type_failure(rows, typer),
    }
    inconsistent = sum(r.inconsistent for r in rows)
    if inconsistent:
        summary["score_disagrees_with_statuses"] = inconsistent
    return summary


class NoCommonTasks(ValueError):
    """Two runs to compare share no task: there is nothing to pair."""


def paired_rates(pairs: list[tuple[bool, bool]]) -> dict:
    """Before/after task outcomes, paired: the difference of the two rates with its
    paired 95% interval, the discordant counts and McNemar's exact p."""
    both = sum(x and y for x, y in pairs)
    newly = sum(y and not x for x, y in pairs)
    broken = sum(x and not y for x, y in pairs)
    n = len(pairs)
    neither = n - both - newly - broken
    return {"tasks": n, "delta_task_solving_rate": _pct(newly - broken, n),
            "delta_task_solving_rate_ci95": statistics.paired_difference_ci(both, newly, broken, neither),
            "mcnemar_p": statistics.mcnemar_exact(newly, broken), "newly_solved": newly, "broken_solved": broken}


def compare(before, after, *, bin_of=None) -> dict:
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
    overall = paired_rates(pairs)
    repair_p = _pct(repairs, x0)
    regression = _pct(regressions, x1)
    return {
        **{k: v for k, v in overall.items() if k != "tasks"},
        "tasks_compared": len(common),
        "tasks_only_before": len(set(b_rows) - set(a_rows)),
        "tasks_only_after": len(set(a_rows) - set(b_rows)),
        "delta_rubric_pass_rate": _pct(sum(fraction_deltas), len(fraction_deltas)),
        "delta_rubric_pass_rate_ci95": statistics.bootstrap_mean_ci(fraction_deltas),
        "by_length_bin": {b: paired_rates(by_bin[b]) for b in LENGTH_BINS if b in by_bin},
        "migration": migration,
        "preserved_solved": sum(x and y for x, y in pairs),
        "net_solved_gain": overall["newly_solved"] - overall["broken_solved"],
        "change_rate": _pct(changed, total),
        "repair_probability": repair_p,
        "regression_risk": regression,
        "positive_change_precision": _pct(repairs, changed),
        "benefit_risk_ratio": round(repair_p / regression, 2) if repair_p is not None and regression else None,
        "net_requirement_gain": _pct(repairs - regressions, total),
    }


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
            "single_vote_agreement": _pct(sum(s for s, _ in items), len(items)),
            "majority_vote_agreement": _pct(sum(m for _, m in items), len(items)),
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


def method_label(method: str | None, ablate=()) -> str | None:
    """What a reader calls a run: "baseline", "contextguard (no protection)"."""
    if not method:
        return None
    base, _, removed = method.partition("-no-")
    gone = sorted({removed, *ablate} - {""})
    return base + (f" (no {', no '.join(gone)})" if gone else "")


def row_label(row: GradedRow) -> str | None:
    """A graded row's run label, from its method and the ablations it was generated with."""
    generation = ((row.model_extra or {}).get("cg_dspy") or {}).get("generation") or {}
    config = generation.get("config") if isinstance(generation, dict) else None
    ablate = config.get("ablate") or () if isinstance(config, dict) else ()
    return method_label(row.method, ablate if isinstance(ablate, (list, tuple)) else ())


@dataclass
class Labelled:
    """Graded files as a report's runs: one per label (a file mixing methods is several
    runs); files of one method, settings and tasks are repeats of one run, which stands
    for them by its per-task majority (`majority`); `notes` says why files of one label
    are not repeats."""

    runs: dict[str, list[GradedRow]] = field(default_factory=dict)
    repeats: dict[str, list[list[GradedRow]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _settings(rows: list[GradedRow]) -> dict | None:
    """What produced a file's rows (generation and grading), its repeat number left out;
    None for rows from elsewhere, which say nothing to tell repeats apart by."""
    block = (rows[0].model_extra or {}).get("cg_dspy") or {} if rows else {}
    generation = block.get("generation") if isinstance(block, dict) else None
    if not isinstance(generation, dict):
        return None
    return {"generation": {k: v for k, v in generation.items() if k != "repeat"}, "grading": block.get("run")}


def majority(repeats: list[list[GradedRow]]) -> list[GradedRow]:
    """One row per task standing for its repeats: the first repeat's row whose outcome is
    the majority outcome (solved in more than half of the repeats; a tie is unsolved), so
    every figure reads a real, consistent row."""
    by_task: dict[str, list[GradedRow]] = defaultdict(list)
    for rows in repeats:
        for r in rows:
            by_task[r.task_id].append(r)
    chosen = []
    for rows in by_task.values():
        solved = sum(r.solved for r in rows) > len(repeats) / 2
        chosen.append(next((r for r in rows if r.solved == solved), rows[0]))
    return chosen


def label_files(files: dict[str, list]) -> Labelled:
    """Graded files as runs, by label: rows without a method are labelled by their file's
    name (its path when two files share a name); a label two files share is one run of
    repeats when their settings (but the repeat) and tasks agree, else one run per file
    named by its file, with the difference said."""
    from cg_dspy.evaluation.store import differences

    groups: dict[tuple[str | None, str], list[GradedRow]] = {}
    for path, rows in files.items():
        for row in graded_rows(rows):
            groups.setdefault((row_label(row), path), []).append(row)
    names = [Path(path).name for _, path in groups]

    def where(path: str) -> str:  # the file's name, or its whole path when two files share a name
        return Path(path).name if names.count(Path(path).name) == 1 else path

    out = Labelled()
    by_label: dict[str | None, list[str]] = defaultdict(list)
    for label, path in groups:
        by_label[label].append(path)
    for label, paths in by_label.items():
        if label is None or len(paths) == 1:
            for path in paths:
                out.runs[where(path) if label is None else label] = groups[(label, path)]
            continue
        runs = [groups[(label, path)] for path in paths]
        settings = [_settings(rows) for rows in runs]
        tasks = [{r.task_id for r in rows} for rows in runs]
        if settings[0] is not None and all(x == settings[0] for x in settings) and all(t == tasks[0] for t in tasks):
            out.repeats[label] = runs
            out.runs[label] = majority(runs)
            continue
        for path, rows in zip(paths, runs):
            out.runs[f"{label} [{where(path)}]"] = rows
        other = next((i for i in range(1, len(runs)) if settings[i] != settings[0] or tasks[i] != tasks[0]), 1)
        if settings[0] is None or settings[other] is None:
            why = "no recorded settings to match"
        elif settings[other] != settings[0]:
            why = "; ".join(differences(settings[other], settings[0])[:4])
        else:
            why = "other tasks"
        out.notes.append(f"{label}: {where(paths[0])} and {where(paths[other])} are not repeats of one run ({why}); "
                         "reported as separate runs")
    return out


def runs_by_label(files: dict[str, list]) -> dict[str, list[GradedRow]]:
    """One run per label (see `label_files`; repeats as their per-task majority)."""
    return label_files(files).runs


def repeat_summary(repeats: list[list[GradedRow]]) -> dict:
    """Repeats of one run as CL-bench's leaderboard prints them: the task-solving rate's
    mean ± sample std over the runs, overall and per category."""
    rates = [100.0 * sum(r.solved for r in rows) / len(rows) for rows in repeats if rows]
    mean, std = statistics.mean_std(rates)
    categories = sorted({r.metadata.context_category for rows in repeats for r in rows})
    by_category = {}
    for cat in categories:
        per_run = [[r for r in rows if r.metadata.context_category == cat] for rows in repeats]
        cat_mean, cat_std = statistics.mean_std([100.0 * sum(r.solved for r in rows) / len(rows)
                                                 for rows in per_run if rows])
        by_category[cat] = {"mean": cat_mean, "std": cat_std}
    return {"runs": len(repeats), "tasks": len(repeats[0]) if repeats else 0, "mean": mean, "std": std,
            "task_solving_rates": [round(x, 2) for x in rates], "by_category": by_category}


def comparisons(result: dict) -> dict[tuple[str, str], dict]:
    """A report's paired comparisons, (before, after) run labels to their numbers."""
    out = {tuple(title.split(" -> ", 1)): c for title, c in (result.get("comparisons") or {}).items()}
    if "comparison" in result:
        names = list(result["runs"])
        out[(names[0], names[1])] = result["comparison"]
    return out


def report(runs: dict[str, list], *, typer=rubric_type, typer_name: str = "keyword",
           repeats: dict[str, list[list]] | None = None, notes: list[str] = ()) -> dict:
    """The JSON report: `runs`, plus `comparison` for two runs (paired over their common
    tasks), `repeats` (mean ± std per run that has them), `judge_stability` (per run
    graded with every vote drawn, else null with `judge_stability_reason`) and `cost` when
    the graded rows carry generation cost."""
    runs = {name: graded_rows(rows) for name, rows in runs.items()}
    bins: dict[int, str] = {}

    def bin_of(row: GradedRow) -> str:  # every conversation tokenized once
        if id(row) not in bins:
            bins[id(row)] = length_bin(token_length(row.messages))
        return bins[id(row)]

    out: dict = {"runs": {name: run_summary(rows, typer, bin_of) for name, rows in runs.items()},
                 "rubric_typer": typer_name}
    names = list(runs)
    if len(names) == 2:
        out["comparison"] = compare(runs[names[0]], runs[names[1]], bin_of=bin_of)
    if repeats:
        out["repeats"] = {name: repeat_summary([graded_rows(r) for r in rows]) for name, rows in repeats.items()}
    if notes:
        out["notes"] = list(notes)
    stability = {name: judge_stability(rows) for name, rows in runs.items()}
    stability = {k: v for k, v in stability.items() if v is not None}
    out["judge_stability"] = stability or None
    reason = stability_reason(runs, stability)
    if reason:
        out["judge_stability_reason"] = reason
    cost = {name: cost_summary(rows) for name, rows in runs.items()}
    cost = {k: v for k, v in cost.items() if v is not None}
    if cost:
        out["cost"] = cost
    return out


def report_files(files: dict[str, list], **options) -> dict:
    """`report` over graded files: runs by label, repeats summarized, notes kept."""
    labelled = label_files(files)
    return report(labelled.runs, repeats=labelled.repeats, notes=labelled.notes, **options)
