import json

import pytest
from conftest import DATA, shared_file

from cg_dspy.clbench import data, lengths
from cg_dspy.method.schemas import CATEGORIES


def test_real_clbench_rows_load_and_validate():
    loaded = data.load_tasks(shared_file("tasks_sample.jsonl"))
    assert loaded.errors == [] and len(loaded.tasks) == 8
    assert {t.category for t in loaded.tasks} == set(CATEGORIES)
    multi = [t for t in loaded.tasks if sum(m.role == "assistant" for m in t.messages) > 0]
    assert multi and all(t.messages[-1].role == "user" for t in loaded.tasks)
    assert all(t.system for t in loaded.tasks)


def test_project_data_files_meet_their_bounds():
    demo = data.load_tasks(DATA / "demo.jsonl")
    tasks = data.load_tasks(DATA / "tasks.jsonl")
    assert demo.errors == [] and tasks.errors == []
    assert sorted(t.category for t in demo.tasks) == sorted(CATEGORIES)
    assert all(lengths.token_length(t.messages) < 400 and 3 <= len(t.rubrics) <= 6 for t in demo.tasks)
    assert len(tasks.tasks) >= 12
    assert all(sum(t.category == c for t in tasks.tasks) >= 3 for c in CATEGORIES)
    assert all(lengths.token_length(t.messages) < 1500 and 4 <= len(t.rubrics) <= 10 for t in tasks.tasks)


def good_row(tid):
    return {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
            "rubrics": ["r1"], "metadata": {"task_id": tid, "context_id": "c", "context_category": CATEGORIES[0],
                                            "sub_category": "x"}}


def test_bad_rows_are_reported_by_file_line_and_task_and_the_rest_load(tmp_path):
    rows = [json.dumps(good_row("ok-1")).encode(), b"{not json",
            json.dumps({**good_row("no-msgs"), "messages": []}).encode(),
            json.dumps({**good_row("bad-role"), "messages": [{"role": "robot", "content": "q"}]}).encode(),
            json.dumps({**good_row("no-rubrics"), "rubrics": []}).encode(),
            json.dumps({**good_row("no-cat"), "metadata": {"task_id": "no-cat", "context_id": "c"}}).encode(),
            b'{"messages": "caf\xe9"}',
            json.dumps(good_row("ok-1")).encode(),
            json.dumps({**good_row("ends-assistant"), "messages": [{"role": "assistant", "content": "a"}]}).encode(),
            json.dumps({**good_row("typed"), "rubrics": "one string"}).encode(),
            json.dumps(good_row("ok-2")).encode()]
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(rows) + b"\n")
    loaded = data.load_tasks(path)
    assert [t.idx for t in loaded.tasks] == ["ok-1", "ok-2"]
    errors = {e.line: e for e in loaded.errors}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert "invalid JSON" in errors[2].message
    assert errors[3].task_id == "no-msgs" and "messages" in errors[3].message
    assert "messages.0.role" in errors[4].message
    assert "rubrics" in errors[5].message
    assert "metadata.context_category" in errors[6].message
    assert "not UTF-8" in errors[7].message
    assert errors[8].message == "duplicate task_id"
    assert "user" in errors[9].message
    assert str(errors[4]).startswith(f"{path}:4: task bad-role: ")
    with pytest.raises(data.InvalidInput) as exc:
        data.load_tasks(path, strict=True)
    assert len(exc.value.errors) == 9


def test_splits_are_deterministic_grouped_by_context_and_stratified():
    tasks = data.load_tasks(DATA / "tasks.jsonl").tasks + data.load_tasks(DATA / "demo.jsonl").tasks
    splits = data.make_splits(tasks, (0.34, 0.33, 0.33), seed="s")
    assert splits == data.make_splits(list(reversed(tasks)), (0.34, 0.33, 0.33), seed="s")
    by_id = {t.idx: t for t in tasks}
    ctx = {name: {by_id[i].metadata.context_id for i in ids} for name, ids in splits.items()}
    assert not (ctx["train"] & ctx["dev"]) and not (ctx["train"] & ctx["test"]) and not (ctx["dev"] & ctx["test"])
    assert sorted(i for ids in splits.values() for i in ids) == sorted(by_id)
    for name in ("train", "dev", "test"):  # 4+ contexts per category: every split gets each category
        assert {by_id[i].category for i in splits[name]} == set(CATEGORIES)
    assert data.make_splits(tasks, (0.34, 0.33, 0.33), seed="other") != splits


def test_manifest_selects_one_split(tmp_path):
    tasks = data.load_tasks(DATA / "tasks.jsonl").tasks
    splits = data.make_splits(tasks, (0.5, 0.25, 0.25))
    manifest = tmp_path / "m.json"
    data.write_manifest(manifest, splits, seed="cg-dspy-1", source=str(DATA / "tasks.jsonl"))
    chosen = data.select(f"{manifest}#dev")
    assert sorted(t.idx for t in chosen.tasks) == sorted(splits["dev"])


def test_token_length_counts_cl100k_tokens_offline():
    assert lengths.token_length([{"role": "user", "content": "hello world"}]) == 2


def test_dataset_source_loads_through_datasets_offline(tmp_path, monkeypatch):
    """`datasets.load_dataset` reads a local copy laid out like the hub dataset."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    folder = tmp_path / "tencent" / "CL-bench"
    folder.mkdir(parents=True)
    src = shared_file("tasks_sample.jsonl")
    (folder / "train.jsonl").write_bytes(src.read_bytes())
    monkeypatch.chdir(tmp_path)
    loaded = data.load_tasks("tencent/CL-bench")
    assert loaded.errors == []
    assert [t.idx for t in loaded.tasks] == [t.idx for t in data.load_tasks(src).tasks]
