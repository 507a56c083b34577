"""Requirement types (Table 2): the keyword typer measured against hand labels of the 67
real CL-bench rubrics, and the LM typer through a real HTTP server, one call per unique
rubric, cached beside the graded files."""

import json
import shutil
from pathlib import Path

from conftest import cli, shared_file

from cg_dspy.judge.typer import cache_path
from cg_dspy.reports import analysis
from cg_dspy.testing.server import ChatServer

LABELS = Path(__file__).parent / "fixtures" / "rubric_types.jsonl"
KEYWORD_AGREEMENT_FLOOR = 48  # of 67; raise it when the cues improve


def labels() -> list[dict]:
    return [json.loads(line) for line in LABELS.read_text(encoding="utf-8").splitlines()]


def test_the_hand_labels_cover_every_rubric_of_the_real_sample():
    rows = [json.loads(line) for line in shared_file("graded_sample.jsonl").read_text().splitlines()]
    rubrics = [(r["metadata"]["task_id"], i, x if isinstance(x, str) else x["rubric_criteria"])
               for r in rows for i, x in enumerate(r["rubrics"])]
    assert [(x["task_id"], x["index"], x["rubric"]) for x in labels()] == rubrics
    assert all(x["type"] in (*analysis.RUBRIC_TYPES, "other") and x["reason"].strip() for x in labels())


def test_keyword_typer_agreement_with_the_hand_labels_does_not_regress():
    hand = labels()
    agree = [x for x in hand if (analysis.rubric_type(x["rubric"]) or "other") == x["type"]]
    per_type = {t: (sum(x["type"] == t for x in agree), sum(x["type"] == t for x in hand))
                for t in (*analysis.RUBRIC_TYPES, "other")}
    print(f"\nkeyword typer vs hand labels: {len(agree)}/{len(hand)} = {100 * len(agree) / len(hand):.1f}%; "
          + ", ".join(f"{t} {a}/{n}" for t, (a, n) in per_type.items()))
    assert len(agree) >= KEYWORD_AGREEMENT_FLOOR


def test_lm_typer_types_each_unique_rubric_once_and_a_rerun_makes_no_call(tmp_path):
    hand = {x["rubric"]: x["type"] for x in labels()}

    def reply(messages):
        text = messages[-1]["content"]
        rubric = text.split("[[ ## requirement ## ]]")[-1].split("\n\nRespond with")[0].strip()
        return json.dumps({"requirement_type": hand[rubric]})

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"  # the same 67 rubrics in both runs
    shutil.copy(shared_file("graded_sample.jsonl"), first)
    shutil.copy(shared_file("graded_sample.jsonl"), second)
    with ChatServer(reply=reply) as server:
        args = ["report", str(first), str(second), "--format", "json", "--rubric-types", "lm",
                "--judge-model", "openai/typer", "--judge-api-base", server.base_url, "--no-cache", "--retries", "0"]
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        typed = [r for r in server.requests if "requirement_type" in json.dumps(r)]
        assert len(typed) == len(server.requests) == 67  # one call per unique rubric, none per file
        rep = json.loads(done.stdout)
        assert rep["rubric_typer"] == "LM (openai/typer)"
        for path in (first, second):
            cache = json.loads(cache_path(path).read_text())
            assert cache["types"] == hand and cache["typer"]["model"] == "openai/typer"
        again = cli(*args)
        assert again.returncode == 0 and len(server.requests) == 67  # the caches answered
        assert json.loads(again.stdout) == rep
    expected = analysis.rubric_type_failure(
        [json.loads(line) for line in first.read_text().splitlines()],
        typer=lambda r: None if hand[r] == "other" else hand[r])
    assert list(rep["runs"].values())[0]["rubric_type_failure"] == expected
    keyword = json.loads(cli("report", str(first), "--format", "json").stdout)
    assert keyword["rubric_typer"] == "keyword"
    assert list(keyword["runs"].values())[0]["rubric_type_failure"] != expected  # the typer decides Table 2


def test_a_cache_that_cannot_be_written_leaves_the_types_and_says_so(tmp_path):
    from cg_dspy.judge.typer import LMTyper
    from cg_dspy.lms import LMSettings, build_lm

    graded = tmp_path / "g.jsonl"
    shutil.copy(shared_file("graded_sample.jsonl"), graded)
    cache_path(graded).mkdir()  # where the cache would go, something it cannot replace
    with ChatServer(reply=lambda messages: json.dumps({"requirement_type": "format/lexical"})) as server:
        typer = LMTyper(build_lm(LMSettings(model="openai/typer", api_base=server.base_url, cache=False,
                                            num_retries=0)), threads=2)
        typer.type_files({str(graded): [r for x in graded.read_text().splitlines() for r in json.loads(x)["rubrics"]]})
    assert len(typer.types) == 67 and typer("The response should be between 50 and 100 words long.") == \
        "format/lexical"
    assert len(typer.unsaved) == 1 and str(cache_path(graded)) in typer.unsaved[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.jsonl", "g.jsonl.rubric_types.json"]  # no debris


def test_a_typer_lm_that_never_answers_fails_fast_and_one_that_garbles_is_asked_again(tmp_path):
    graded = tmp_path / "g.jsonl"
    shutil.copy(shared_file("graded_sample.jsonl"), graded)
    done = cli("report", str(graded), "--rubric-types", "lm", "--judge-model", "openai/x", "--judge-api-base",
               "http://127.0.0.1:9/v1", "--retries", "0")
    assert done.returncode == 1 and "typer's LM (openai/x) did not answer" in done.stderr and done.stdout == ""
    assert not cache_path(graded).exists()
    hand = {x["rubric"]: x["type"] for x in labels()}
    garbled = next(iter(hand))
    def reply(messages):
        rubric = messages[-1]["content"].split("[[ ## requirement ## ]]")[-1].split("\n\nRespond with")[0].strip()
        return "no idea" if rubric == garbled else json.dumps({"requirement_type": hand[rubric]})
    with ChatServer(reply=reply) as server:
        args = ["report", str(graded), "--rubric-types", "lm", "--judge-model", "openai/x", "--judge-api-base",
                server.base_url, "--retries", "0", "--format", "json"]
        done = cli(*args)
        assert done.returncode == 0 and "66 rubrics typed by the judge LM, 67 LM calls" in done.stderr
        assert len(server.requests) == 66 + 3  # the garbled one asked three times (no LM cache to hand it back)
        assert garbled not in json.loads(cache_path(graded).read_text())["types"]
        again = cli(*args)
        assert "1 LM calls this time" in again.stderr and len(server.requests) == 66 + 6  # only it, again
