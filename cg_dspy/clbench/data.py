"""CL-bench loading, validation, splits and length bins.

Rows come from a local JSONL file in CL-bench's format or from
`datasets.load_dataset("tencent/CL-bench")` (any local cache or offline copy works).
CLBench-life rows (`tencent/CLBench-life`) load the same way: their categories are
CLBench-life's own, their sub-category is `context_subcategory`, and they carry no
`context_id` (a task is then its own context for splits).
A bad row never stops the others: it becomes a `RowError` naming source, line, task id
and field, and the caller decides whether to skip it or stop (`strict`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from cg_dspy.core import files
from cg_dspy.core.messages import Message, category_order

HF_DATASET = "tencent/CL-bench"
HF_DATASETS = (HF_DATASET, "tencent/CLBench-life")  # the family: one loader, one format


def with_sub_category(metadata: object) -> object:
    """Metadata whose `sub_category` is CLBench-life's `context_subcategory` when only
    that is given."""
    if isinstance(metadata, dict) and not metadata.get("sub_category") and metadata.get("context_subcategory"):
        return {**metadata, "sub_category": metadata["context_subcategory"]}
    return metadata


def rubric_text(value: object) -> object:
    """A rubric's text: CL-bench rows hold strings or `{"rubric_criteria": "..."}`."""
    if isinstance(value, dict) and isinstance(value.get("rubric_criteria"), str):
        return value["rubric_criteria"]
    return value


RubricText = Annotated[str, BeforeValidator(rubric_text)]


class TaskMetadata(BaseModel):
    """CL-bench's per-task metadata; unknown keys are kept. Any category is a category
    (CLBench-life has its own three); CLBench-life names the sub-category
    `context_subcategory` and gives no `context_id`."""

    model_config = ConfigDict(extra="allow")
    task_id: str = Field(min_length=1)
    context_id: str | None = Field(default=None, min_length=1)
    context_category: str = Field(min_length=1)
    sub_category: str = ""

    @model_validator(mode="before")
    @classmethod
    def _life_sub_category(cls, data: object) -> object:
        return with_sub_category(data)

    @property
    def context(self) -> str:
        """The context a task reads: its `context_id`, or the task itself when none is given."""
        return self.context_id or f"task:{self.task_id}"


class Task(BaseModel):
    """One CL-bench row: the whole conversation, its rubrics and its metadata."""

    messages: list[Message] = Field(min_length=1)
    rubrics: list[RubricText] = Field(min_length=1)
    metadata: TaskMetadata

    @field_validator("messages")
    @classmethod
    def _ends_with_user(cls, messages: list[Message]) -> list[Message]:
        if messages[-1].role != "user":
            raise ValueError("the last message must be the user's task request")
        return messages

    @field_validator("rubrics")
    @classmethod
    def _rubrics_are_text(cls, rubrics: list[str]) -> list[str]:
        if any(not r.strip() for r in rubrics):
            raise ValueError("rubrics must be non-empty strings")
        return rubrics

    @property
    def idx(self) -> str:
        return self.metadata.task_id

    @property
    def category(self) -> str:
        return self.metadata.context_category

    @property
    def system(self) -> str:
        """s: the system instruction (empty when the row has none)."""
        return "\n\n".join(m.content for m in self.messages if m.role == "system")

    @property
    def request(self) -> str:
        """q: the final user message, the task request."""
        return self.messages[-1].content


@dataclass(frozen=True)
class RowError:
    source: str
    line: int
    task_id: str | None
    message: str

    def __str__(self) -> str:
        task = f" task {self.task_id}" if self.task_id else ""
        return f"{self.source}:{self.line}:{task}: {self.message}"


@dataclass
class Loaded:
    tasks: list[Task] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)


class InvalidInput(ValueError):
    """Raised in strict mode, before any LM call, listing every bad row."""

    def __init__(self, errors: list[RowError]):
        self.errors = errors
        super().__init__("invalid input:\n" + "\n".join(str(e) for e in errors))


def _task_id_of(row: object) -> str | None:
    if isinstance(row, dict) and isinstance(row.get("metadata"), dict):
        tid = row["metadata"].get("task_id")
        return str(tid) if tid is not None else None
    return None


def explain(exc: pydantic.ValidationError) -> str:
    """One line naming each invalid field and why."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "row"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def validate_rows(rows, source: str) -> Loaded:
    """Validate (line, row) pairs into Tasks; duplicates and bad rows become errors."""
    out = Loaded()
    seen: set[str] = set()
    for line, row in rows:
        if isinstance(row, RowError):
            out.errors.append(row)
            continue
        tid = _task_id_of(row)
        try:
            task = Task.model_validate(row)
        except pydantic.ValidationError as exc:
            out.errors.append(RowError(source, line, tid, explain(exc)))
            continue
        if task.idx in seen:
            out.errors.append(RowError(source, line, tid, "duplicate task_id"))
            continue
        seen.add(task.idx)
        out.tasks.append(task)
    return out


def _jsonl_rows(path: Path):
    with open(path, "rb") as fh:
        for line, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield line, RowError(str(path), line, None, f"not UTF-8 (byte {exc.start})")
                continue
            try:
                yield line, json.loads(text)
            except json.JSONDecodeError as exc:
                yield line, RowError(str(path), line, None, f"invalid JSON: {exc.msg} (column {exc.colno})")


def _hub_rows(name: str, split: str):
    import datasets  # heavy; only when the hub source is used

    ds = datasets.load_dataset(name, split=split)
    for i, row in enumerate(ds, start=1):
        yield i, dict(row)


def load_tasks(source: str | os.PathLike, *, strict: bool = False) -> Loaded:
    """Load tasks from a JSONL file, or `tencent/CL-bench[:split]`,
    `tencent/CLBench-life[:split]` (or a dataset folder) through `datasets.load_dataset`."""
    text = str(source)
    name, _, split = text.partition(":")
    if Path(text).is_file():
        loaded = validate_rows(_jsonl_rows(Path(text)), text)
    elif name in HF_DATASETS or Path(name).is_dir():
        # A local folder named like the dataset (or the HF cache) serves offline.
        loaded = validate_rows(_hub_rows(name, split or "train"), text)
    else:
        raise FileNotFoundError(f"no such task file: {text}")
    if strict and loaded.errors:
        raise InvalidInput(loaded.errors)
    return loaded


# --- splits ------------------------------------------------------------------------

SPLIT_NAMES = ("train", "dev", "test")


def _rank(seed: str, context_id: str) -> str:
    return hashlib.sha256(f"{seed}:{context_id}".encode()).hexdigest()


def make_splits(
    tasks: list[Task], fractions: tuple[float, float, float] = (0.2, 0.2, 0.6), seed: str = "cg-dspy-1"
) -> dict[str, list[str]]:
    """Deterministic train/dev/test task ids, grouped by context, stratified by category.

    Within each category, contexts are ordered by a stable hash and dealt out so each
    split gets its fraction of that category's contexts; every task of a context goes
    where its context goes. Anyone with the same rows and seed gets the same split.
    """
    if abs(sum(fractions) - 1.0) > 1e-9 or any(f < 0 for f in fractions):
        raise ValueError("fractions must be non-negative and sum to 1")
    contexts: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for t in tasks:
        contexts[t.category][t.metadata.context].append(t.idx)
    splits: dict[str, list[str]] = {name: [] for name in SPLIT_NAMES}
    for category in sorted(contexts, key=category_order):
        ordered = sorted(contexts[category], key=lambda cid: _rank(seed, cid))
        n = len(ordered)
        bounds = [round(n * sum(fractions[: i + 1])) for i in range(3)]
        start = 0
        for name, end in zip(SPLIT_NAMES, bounds):
            for cid in ordered[start:end]:
                splits[name].extend(sorted(contexts[category][cid]))
            start = end
    return splits


def _is_manifest(body: object) -> bool:
    return isinstance(body, dict) and isinstance(body.get("splits"), dict) and "seed" in body


MANIFEST = files.json_kind("a split manifest", _is_manifest)


def write_manifest(path: str | os.PathLike, splits: dict[str, list[str]], *, seed: str, source: str,
                   force: bool = False) -> None:
    """A split manifest: the task ids of each split, plus how they were made. Only a
    manifest (or, with `force`, any regular file) is replaced, never the task file."""
    body = {"source": source, "seed": seed, "splits": splits}
    files.write(path, (json.dumps(body, indent=1) + "\n").encode("utf-8"), MANIFEST, force=force,
                inputs=(source,))


def _manifest_source(source: str, manifest: Path) -> str:
    """A manifest's source: as written, else relative to the manifest or a folder above it."""
    if Path(source).exists() or source.split(":")[0] in HF_DATASETS:
        return source
    for folder in manifest.resolve().parents:
        if (folder / source).exists():
            return str(folder / source)
    return source


def select(source: str, *, strict: bool = False) -> Loaded:
    """`FILE`, `tencent/CL-bench`, or `MANIFEST.json#split` (tasks of one split)."""
    if "#" in source and source.split("#")[0].endswith(".json"):
        manifest_path, split = source.split("#", 1)
        try:
            manifest = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{manifest_path}: not a split manifest (not JSON: {exc})") from None
        if not _is_manifest(manifest):
            raise ValueError(f"{manifest_path}: not a split manifest (no 'splits' and 'seed'); write one with "
                             "`contextguard split`")
        if split not in manifest["splits"]:
            raise ValueError(f"{manifest_path}: no split {split!r}; it has {sorted(manifest['splits'])}")
        ids = set(manifest["splits"][split])
        loaded = load_tasks(_manifest_source(manifest["source"], Path(manifest_path)), strict=strict)
        loaded.tasks = [t for t in loaded.tasks if t.idx in ids]
        return loaded
    return load_tasks(source, strict=strict)


def shard(tasks: list[Task], spec: str | None) -> list[Task]:
    """Shard i of n (`"i/n"`): a task's shard is a stable hash of its id, so n machines
    running the same list split it without talking to each other."""
    if not spec:
        return tasks
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ValueError(f"--shard {spec!r}: write it as i/n, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard {spec}: need 0 <= i < n")
    return [t for t in tasks if int(hashlib.sha256(t.idx.encode()).hexdigest(), 16) % n == i]


def to_example(task: Task):
    """A dspy.Example: inputs `conversation` and `category`; label `rubrics`."""
    import dspy

    return dspy.Example(
        conversation=[m.model_dump() for m in task.messages],
        category=task.category,
        rubrics=list(task.rubrics),
        task_id=task.idx,
    ).with_inputs("conversation", "category")
