"""Conclusions, not just numbers: every rate with its interval, every comparison paired and
tested, repeats as mean ± std, and what a split can detect. The pure functions are checked
against independently computed values (scipy, the standard library), the commands on the
paper's Table 14 rebuilt and on real runs against the test server."""

import json
import math
import random
import statistics as stdlib

import pytest
from conftest import DATA, cli
from scipy import stats
from table14 import table14_rows

from cg_dspy.clbench.store import read_rows
from cg_dspy.reports import statistics
from cg_dspy.testing.server import ChatServer

DEMO = DATA / "demo.jsonl"


# --- the pure functions, against scipy ----------------------------------------------------


@pytest.mark.parametrize("k, n", [(0, 1), (1, 1), (1, 8), (183, 1899), (263, 1899), (5, 5), (0, 40), (17, 23)])
def test_wilson_matches_scipy(k, n):
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert statistics.wilson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert statistics.rate_ci(k, n) == [round(100 * ci.low, 2), round(100 * ci.high, 2)]


@pytest.mark.parametrize("newly, broken", [(140, 60), (60, 140), (0, 0), (5, 0), (3, 4), (1, 12), (500, 450)])
def test_mcnemar_is_scipys_exact_binomial_test_of_the_discordant_tasks(newly, broken):
    expected = 1.0 if newly + broken == 0 else stats.binomtest(newly, newly + broken, 0.5).pvalue
    assert statistics.mcnemar_exact(newly, broken) == pytest.approx(expected, rel=1e-9)


def test_paired_interval_is_newcombes_and_covers_its_difference():
    # Table 14: 123 solved by both, 140 newly, 60 broken, 1,576 by neither.
    lo, hi = statistics.paired_difference_ci(123, 140, 60, 1576)
    assert (lo, hi) == (2.77, 5.68)  # "about 2.8-5.7", and close to the normal approximation:
    se = math.sqrt(200 - 80 ** 2 / 1899) / 1899
    assert lo == pytest.approx(100 * (80 / 1899 - 1.96 * se), abs=0.05)
    assert hi == pytest.approx(100 * (80 / 1899 + 1.96 * se), abs=0.05)
    # never outside [-100, 100], defined with no discordant task and with one task
    lo, hi = statistics.paired_difference_ci(0, 3, 0, 0)  # 3 of 3 newly solved: clearly above 0, capped at 100
    assert 0 < lo < 100 and hi == 100.0
    assert statistics.paired_difference_ci(4, 0, 0, 4)[0] < 0 < statistics.paired_difference_ci(4, 0, 0, 4)[1]
    lo, hi = statistics.paired_difference_ci(0, 0, 0, 1)
    assert -100 <= lo < 0 < hi <= 100


def test_bootstrap_is_seeded_and_brackets_the_mean():
    values = [random.Random(7).random() for _ in range(300)]
    first, again = statistics.bootstrap_mean_ci(values), statistics.bootstrap_mean_ci(values)
    assert first == again  # reproducible
    mean = 100 * sum(values) / len(values)
    half = 100 * 1.96 * stdlib.stdev(values) / math.sqrt(len(values))
    assert first[0] == pytest.approx(mean - half, abs=0.6) and first[1] == pytest.approx(mean + half, abs=0.6)
    assert statistics.bootstrap_mean_ci([0.5]) == [50.0, 50.0]


def test_mean_and_sample_std_as_the_leaderboard_prints_them():
    assert statistics.mean_std([12.5, 14.0, 13.1]) == (round(stdlib.mean([12.5, 14.0, 13.1]), 2),
                                                      round(stdlib.stdev([12.5, 14.0, 13.1]), 2))
    assert statistics.mean_std([10.0]) == (10.0, None) and statistics.mean_std([]) == (None, None)


def test_detectable_difference_has_80_percent_power_by_exact_enumeration():
    for n in (100, 380, 1899):
        d = statistics.detectable_difference(n) / 100
        assert statistics.mcnemar_power(n, statistics.PAPER_DISCORDANCE, d) >= 0.8
        assert statistics.mcnemar_power(n, statistics.PAPER_DISCORDANCE, d - 0.002) < 0.8
    # power by simulation agrees with the enumeration (McNemar's exact test, at the paper's discordance)
    rng, n, d, psi = random.Random(3), 380, 0.048, statistics.PAPER_DISCORDANCE
    hits = 0
    for _ in range(2000):
        newly = broken = 0
        for _ in range(n):
            u = rng.random()
            newly += u < (psi + d) / 2
            broken += (psi + d) / 2 <= u < psi
        hits += statistics.mcnemar_exact(newly, broken) <= 0.05
    assert hits / 2000 == pytest.approx(statistics.mcnemar_power(n, psi, d), abs=0.03)
    # 20 dev tasks cannot tell 10% from 14% (nor anything else); 1,899 tasks tell about 2 points
    assert statistics.detectable_difference(20) is None
    assert 1.5 < statistics.detectable_difference(1899) < 2.5
    assert statistics.detectable_difference(100) > 4


# --- the report, on the paper's Table 14 rebuilt ------------------------------------------


@pytest.fixture(scope="module")
def table14_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("t14")
    before, after = table14_rows()
    paths = []
    for name, rows in (("baseline.jsonl", before), ("contextguard.jsonl", after)):
        paths.append(folder / name)
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def test_table14_report_gives_the_papers_rates_intervals_and_test(table14_files, tmp_path):
    r = cli("report", *map(str, table14_files), "--format", "json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    base, cg = rep["runs"]["baseline"], rep["runs"]["contextguard"]
    assert (base["task_solving_rate"], cg["task_solving_rate"]) == (9.64, 13.85)
    wilson = [stats.binomtest(k, 1899).proportion_ci(method="wilson") for k in (183, 263)]
    assert base["task_solving_rate_ci95"] == [round(100 * wilson[0].low, 2), round(100 * wilson[0].high, 2)]
    assert cg["task_solving_rate_ci95"] == [round(100 * wilson[1].low, 2), round(100 * wilson[1].high, 2)]
    c = rep["comparison"]
    assert c["delta_task_solving_rate"] == 4.21 and c["delta_task_solving_rate_ci95"] == [2.77, 5.68]
    assert c["mcnemar_p"] == pytest.approx(stats.binomtest(60, 200).pvalue, rel=1e-9)
    assert c["mcnemar_p"] == pytest.approx(1.5e-8, rel=0.01)
    assert (c["newly_solved"], c["broken_solved"], c["tasks_compared"]) == (140, 60, 1899)
    lo, hi = c["delta_rubric_pass_rate_ci95"]
    assert lo < c["delta_rubric_pass_rate"] < hi and lo > 0
    md = cli("report", *map(str, table14_files)).stdout
    assert "| baseline | 1899 | 183 | 9.64 | [8.39, 11.05] |" in md
    assert "| contextguard | 1899 | 263 | 13.85 | [12.37, 15.48] |" in md
    assert "| baseline -> contextguard | 1899 | +4.21 [2.77, 5.68] | 1.5e-08 | 140 | 60 |" in md
    page = tmp_path / "r.html"
    assert cli("report", *map(str, table14_files), "--html", str(page)).returncode == 0
    html = page.read_text()
    assert "<td>[8.39, 11.05]</td>" in html and "<td>+4.21 [2.77, 5.68]</td>" in html and "<td>1.5e-08</td>" in html


def test_two_files_with_no_common_task_are_an_error(tmp_path, table14_files):
    other = [json.loads(line) for line in table14_files[1].read_text().splitlines()[:5]]
    for row in other:
        row["idx"] = row["metadata"]["task_id"] = "other-" + row["metadata"]["task_id"]
    path = tmp_path / "other.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in other))
    r = cli("report", str(table14_files[0]), str(path), "--format", "json")
    assert r.returncode == 2 and "share no task" in r.stderr and "Traceback" not in r.stderr


# --- repeats --------------------------------------------------------------------------------


def graded_repeat(rows, repeat, solved_ids, method="contextguard", temperature=0.7):
    out = []
    for row in rows:
        graded = {**row, "method": method, "requirement_status": ["yes" if row["idx"] in solved_ids else "no"],
                  "rubrics": ["r"], "score": int(row["idx"] in solved_ids),
                  "cg_dspy": {"generation": {"method": method, "task_lm": {"temperature": temperature},
                                             "repeat": repeat}, "run": {"protocol": "rubric"}}}
        out.append(graded)
    return out


def test_three_graded_files_of_one_method_are_mean_and_std(tmp_path):
    tasks = [json.loads(line) for line in (DATA / "tasks.jsonl").read_text().splitlines()][:10]
    for row in tasks:
        row["idx"] = row["metadata"]["task_id"]
    solved = [{"dk-01", "dk-02", "rs-01"}, {"dk-01", "rs-01"}, {"dk-01", "dk-02", "rs-01", "pt-01", "pt-02"}]
    paths = []
    for i, ids in enumerate(solved, start=1):
        paths.append(tmp_path / f"cg.r{i}.graded.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in graded_repeat(tasks, i, ids)))
    r = cli("report", *map(str, paths), "--format", "json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    rates = [10 * len(ids) for ids in solved]  # of 10 tasks: 30, 20, 50
    assert rep["repeats"]["contextguard"]["task_solving_rates"] == rates
    assert (rep["repeats"]["contextguard"]["mean"], rep["repeats"]["contextguard"]["std"]) == (
        round(stdlib.mean(rates), 2), round(stdlib.stdev(rates), 2))
    assert list(rep["runs"]) == ["contextguard"]  # one run, by each task's majority outcome
    assert rep["runs"]["contextguard"]["solved"] == 3  # dk-01, dk-02, rs-01: solved in at least 2 of 3
    md = cli("report", *map(str, paths)).stdout
    assert f"| contextguard | 3 | 10 | {stdlib.mean(rates):.2f} ± {stdlib.stdev(rates):.2f} |" in md
    # a file with other settings is not a repeat: a separate run, and the difference is named
    other = tmp_path / "cg.other.graded.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in graded_repeat(tasks, 4, solved[0], temperature=0.0)))
    r = cli("report", str(paths[0]), str(other), "--format", "json")
    rep = json.loads(r.stdout)
    assert "repeats" not in rep and len(rep["runs"]) == 2
    assert "not repeats" in rep["notes"][0] and "temperature" in rep["notes"][0] and "not repeats" in r.stderr


def test_run_repeats_writes_three_files_that_report_reads_as_repeats(tmp_path):
    out = tmp_path / "cg.jsonl"
    with ChatServer() as server:
        lm = ["--model", "openai/test-model", "--api-base", server.base_url, "--temperature", "0.7", "--quiet",
              "--no-track"]
        r = cli("run", str(DEMO), "--out", str(out), "--method", "baseline", "--repeats", "3", *lm)
        assert r.returncode == 0, r.stderr
        files = [tmp_path / f"cg.r{i}.jsonl" for i in (1, 2, 3)]
        assert set(json.loads(r.stdout)) == set(map(str, files)) and not out.exists()
        assert [len(read_rows(f)) for f in files] == [4, 4, 4]
        assert len(server.requests) == 12  # each repeat its own sample: nothing served from another's cache
        assert [read_rows(f)[0]["cg_dspy"]["run"]["repeat"] for f in files] == [1, 2, 3]
        graded = []
        for f in files:
            graded.append(f.with_suffix(".graded.jsonl"))
            assert cli("eval", str(f), "--out", str(graded[-1]), "--judge-model", "openai/test-model",
                       "--judge-api-base", server.base_url, "--quiet", "--no-track").returncode == 0
        n = len(server.requests)
        rerun = cli("run", str(DEMO), "--out", str(out), "--method", "baseline", "--repeats", "3", *lm)
        assert rerun.returncode == 0 and len(server.requests) == n  # every repeat resumed, nothing sent again
    r = cli("report", *map(str, graded), "--format", "json")
    rep = json.loads(r.stdout)
    assert rep["repeats"]["baseline"]["runs"] == 3 and rep["repeats"]["baseline"]["mean"] == 100.0
