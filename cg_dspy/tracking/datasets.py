"""Splits as MLflow evaluation datasets: one record per task (inputs: `conversation`,
`category`; expectations: `rubrics`; the task id as a tag), what `mlflow.genai.evaluate`
and MLflow's evaluation UI read, linked to the runs that used them.

A dataset is named by its split and a digest of its task ids (`contextguard.dev.3f2a…`),
so the same split registered twice is one dataset, and another split never overwrites
it. Its tags say the split, the source and the number of tasks.
"""

from __future__ import annotations

import hashlib

from cg_dspy.tracking.store import mlflow

PREFIX = "contextguard"
BATCH = 200  # records per merge call


def dataset_name(split: str, tasks) -> str:
    digest = hashlib.sha256("\n".join(sorted(t.idx for t in tasks)).encode()).hexdigest()[:12]
    return f"{PREFIX}.{split}.{digest}"


def record(task) -> dict:
    return {"inputs": {"conversation": [m.model_dump() for m in task.messages], "category": task.category},
            "expectations": {"rubrics": list(task.rubrics)}, "tags": {"task_id": task.idx}}


def register_split(split: str, tasks, *, source: str):
    """The split as an evaluation dataset of the current experiment (created once, found
    again by name); returns it."""
    from mlflow.genai.datasets import create_dataset, search_datasets

    name = dataset_name(split, tasks)
    experiment = mlflow().tracking.fluent._get_experiment_id()
    found = [d for d in search_datasets(experiment_ids=[experiment], filter_string=f"name = '{name}'")
             if d.name == name]
    if found:
        return found[0]
    dataset = create_dataset(name=name, experiment_id=experiment,
                             tags={"split": split, "source": source[:250], "tasks": str(len(tasks))})
    records = [record(t) for t in tasks]
    for i in range(0, len(records), BATCH):
        dataset.merge_records(records[i:i + BATCH])
    return dataset


def log_split(split: str, tasks, *, source: str) -> None:
    """The split registered (or found) as an evaluation dataset and linked to the active
    run as an input, in the context of its split."""
    mlflow().log_input(register_split(split, tasks, source=source), context=split)
