"""The report as typed values: what the analyses compute (`analysis`) and every reader
renders (Markdown, figures, the HTML page, MLflow) by attribute, not by key. A rate knows
its interval, a comparison knows which two runs it pairs; `to_dict()` is the JSON
`report --format json` and `report.json` print (the same keys as ever).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cg_dspy.reports import statistics


def pct(num: float, den: float) -> float | None:
    """num/den in percent, two decimals (None without a denominator)."""
    return round(100.0 * num / den, 2) if den else None


@dataclass(frozen=True)
class Rate:
    """A task-solving rate: solved of tasks, with its 95% (Wilson) interval."""

    tasks: int
    solved: int
    category: str | None = None  # a sub-category's macro-category (Figure 3's grouping)

    @property
    def task_solving_rate(self) -> float | None:
        return pct(self.solved, self.tasks)

    @property
    def ci95(self) -> list[float]:
        return statistics.rate_ci(self.solved, self.tasks)

    def to_dict(self) -> dict:
        out = {"tasks": self.tasks, "solved": self.solved, "task_solving_rate": self.task_solving_rate,
               "task_solving_rate_ci95": self.ci95}
        return {**out, "category": self.category} if self.category is not None else out


@dataclass
class RunSummary:
    """Every per-run figure of the report."""

    rate: Rate
    rubric_pass_rate: float | None
    rubric_pass_rate_ci95: list[float]
    by_category: dict[str, Rate]
    by_sub_category: dict[str, Rate]
    by_length_bin: dict[str, Rate]
    near_miss: dict[str, int]
    rubric_type_failure: dict[str, float | None]
    score_disagrees_with_statuses: int = 0

    @property
    def tasks(self) -> int:
        return self.rate.tasks

    @property
    def task_solving_rate(self) -> float | None:
        return self.rate.task_solving_rate

    def to_dict(self) -> dict:
        out = {**self.rate.to_dict(), "rubric_pass_rate": self.rubric_pass_rate,
               "rubric_pass_rate_ci95": self.rubric_pass_rate_ci95,
               "by_category": {k: v.to_dict() for k, v in self.by_category.items()},
               "by_sub_category": {k: v.to_dict() for k, v in self.by_sub_category.items()},
               "by_length_bin": {k: v.to_dict() for k, v in self.by_length_bin.items()},
               "near_miss": dict(self.near_miss), "rubric_type_failure": dict(self.rubric_type_failure)}
        if self.score_disagrees_with_statuses:
            out["score_disagrees_with_statuses"] = self.score_disagrees_with_statuses
        return out


@dataclass(frozen=True)
class Paired:
    """Two runs' outcomes on the same tasks: solved by both, only after, only before, neither."""

    both: int
    newly: int
    broken: int
    neither: int

    @classmethod
    def of(cls, pairs: list[tuple[bool, bool]]) -> Paired:
        """From (before solved, after solved) per task."""
        return cls(sum(x and y for x, y in pairs), sum(y and not x for x, y in pairs),
                   sum(x and not y for x, y in pairs), sum(not x and not y for x, y in pairs))

    @property
    def tasks(self) -> int:
        return self.both + self.newly + self.broken + self.neither

    @property
    def delta(self) -> float | None:
        """After minus before, in points."""
        return pct(self.newly - self.broken, self.tasks)

    @property
    def ci95(self) -> list[float]:
        return statistics.paired_difference_ci(self.both, self.newly, self.broken, self.neither)

    @property
    def mcnemar_p(self) -> float:
        return statistics.mcnemar_exact(self.newly, self.broken)

    def to_dict(self) -> dict:
        return {"tasks": self.tasks, "delta_task_solving_rate": self.delta, "delta_task_solving_rate_ci95": self.ci95,
                "mcnemar_p": self.mcnemar_p, "newly_solved": self.newly, "broken_solved": self.broken}


@dataclass
class Comparison:
    """`before` -> `after` over the tasks both runs hold (Appendix H-I)."""

    before: str
    after: str
    paired: Paired
    tasks_only_before: int
    tasks_only_after: int
    delta_rubric_pass_rate: float | None
    delta_rubric_pass_rate_ci95: list[float]
    by_length_bin: dict[str, Paired]
    migration: dict[str, dict[str, int]]
    repair: dict[str, float | int | None]  # preserved_solved, net_solved_gain, change_rate, ...

    @property
    def title(self) -> str:
        return f"{self.before} -> {self.after}"

    def to_dict(self) -> dict:
        paired = self.paired.to_dict()
        tasks = paired.pop("tasks")
        return {**paired, "tasks_compared": tasks, "tasks_only_before": self.tasks_only_before,
                "tasks_only_after": self.tasks_only_after, "delta_rubric_pass_rate": self.delta_rubric_pass_rate,
                "delta_rubric_pass_rate_ci95": self.delta_rubric_pass_rate_ci95,
                "by_length_bin": {k: v.to_dict() for k, v in self.by_length_bin.items()},
                "migration": self.migration, **self.repair}


@dataclass
class Repeats:
    """Repeats of one run, as CL-bench's leaderboard prints them: mean ± sample std."""

    rates: list[float]  # each repeat's task-solving rate
    tasks: int
    by_category: dict[str, list[float]]

    @property
    def runs(self) -> int:
        return len(self.rates)

    @property
    def mean_std(self) -> tuple[float | None, float | None]:
        return statistics.mean_std(self.rates)

    def to_dict(self) -> dict:
        mean, std = self.mean_std
        by_category = {c: dict(zip(("mean", "std"), statistics.mean_std(v))) for c, v in self.by_category.items()}
        return {"runs": self.runs, "tasks": self.tasks, "mean": mean, "std": std,
                "task_solving_rates": [round(x, 2) for x in self.rates], "by_category": by_category}


@dataclass
class Report:
    """The whole report: every run, its pairs, repeats, judge stability and cost."""

    runs: dict[str, RunSummary]
    comparisons: list[Comparison] = field(default_factory=list)
    repeats: dict[str, Repeats] = field(default_factory=dict)
    judge_stability: dict[str, dict] | None = None  # per run graded with every vote drawn (Table 5)
    judge_stability_reason: str | None = None
    cost: dict[str, dict] = field(default_factory=dict)  # per run: LM calls, tokens, seconds per task
    rubric_typer: str = "keyword"
    notes: list[str] = field(default_factory=list)

    def comparison(self, before: str, after: str) -> Comparison | None:
        return next((c for c in self.comparisons if (c.before, c.after) == (before, after)), None)

    def to_dict(self) -> dict:
        out: dict = {"runs": {name: run.to_dict() for name, run in self.runs.items()},
                     "rubric_typer": self.rubric_typer}
        if self.comparisons:
            out["comparisons"] = {c.title: c.to_dict() for c in self.comparisons}
            if len(self.comparisons) == 1:
                out["comparison"] = out["comparisons"][self.comparisons[0].title]
        if self.repeats:
            out["repeats"] = {name: r.to_dict() for name, r in self.repeats.items()}
        if self.notes:
            out["notes"] = list(self.notes)
        out["judge_stability"] = self.judge_stability
        if self.judge_stability_reason:
            out["judge_stability_reason"] = self.judge_stability_reason
        if self.cost:
            out["cost"] = self.cost
        return out
