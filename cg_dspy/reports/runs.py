"""Which graded files are which runs: a run is named by its method and ablations
("contextguard (no protection)"), a file mixing methods is several runs, and files of one
method whose settings (but the repeat number) and tasks agree are repeats of one run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from cg_dspy.clbench.rows import GradedRow, graded_rows


def method_label(method: str | None, ablate=(), revision_mode: str | None = None) -> str | None:
    """What a reader calls a run: "baseline", "contextguard (no protection)",
    "contextguard (edit)" (edit-mode revision)."""
    if not method:
        return None
    base, _, removed = method.partition("-no-")
    notes = ["edit"] if base.endswith("-edit") or revision_mode == "edit" else []
    notes += [f"no {gone}" for gone in sorted({removed, *ablate} - {""})]
    return base.removesuffix("-edit") + (f" ({', '.join(notes)})" if notes else "")


def row_label(row: GradedRow) -> str | None:
    """A graded row's run label, from its method and the ablations it was generated with."""
    generation = ((row.model_extra or {}).get("cg_dspy") or {}).get("generation") or {}
    config = generation.get("config") if isinstance(generation, dict) else None
    config = config if isinstance(config, dict) else {}
    ablate = config.get("ablate") or ()
    return method_label(row.method, ablate if isinstance(ablate, (list, tuple)) else (), config.get("revision_mode"))


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
    from cg_dspy.clbench.store import differences

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
