"""Figures and the HTML report from graded fixtures: what each figure draws equals the
report's tables, no text overlaps or leaves the figure, a run keeps its colour, runs are
named by method, and report.html holds every table and figure inline."""

import json
import re

import pytest
from conftest import cli
from matplotlib.container import BarContainer
from table14 import TABLE_14, table14_rows

from cg_dspy.clbench.lengths import LENGTH_BINS
from cg_dspy.clbench.store import OutputRefused
from cg_dspy.core.messages import category_order
from cg_dspy.reports import analysis
from cg_dspy.reports.analysis import NEAR_MISS_BINS, RUBRIC_TYPES
from cg_dspy.reports.render import html, markdown, plots, readback
from cg_dspy.reports.runs import runs_by_label


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plots.plt.close("all")


@pytest.fixture(scope="module")
def table14():
    before, after = table14_rows()
    return analysis.report(runs_by_label({"before.jsonl": before, "after.jsonl": after}))


def three_methods():
    """baseline, self-refine and contextguard on the same 1,899 tasks (self-refine: the
    baseline with every fourth task's first failure repaired)."""
    before, after = table14_rows()
    refined = []
    for i, r in enumerate(before):
        status = list(r["requirement_status"])
        if i % 4 == 0 and "no" in status:
            status[status.index("no")] = "yes"
        refined.append({**r, "method": "self-refine", "requirement_status": status,
                        "score": int(all(s == "yes" for s in status))})
    return {"b.jsonl": before, "s.jsonl": refined, "c.jsonl": after}


def test_table14_figures_draw_the_report_numbers_without_overlapping_text(table14):
    runs = table14.to_dict()["runs"]  # what the figures must show, as the JSON report says it
    assert list(runs) == ["baseline", "contextguard"]  # named by method, not by file
    assert (runs["baseline"]["task_solving_rate"], runs["contextguard"]["task_solving_rate"]) == (9.64, 13.85)
    figs = plots.figures(table14)
    assert list(figs) == ["tsr_by_sub_category", "tsr_by_length", "near_miss", "rubric_type_failure", "migration"]
    for stem, fig in figs.items():
        assert readback.overlapping_text(fig) == [], stem
    subs = [s for s in sorted(runs["baseline"]["by_sub_category"],
                              key=lambda s: (category_order(runs["baseline"]["by_sub_category"][s]["category"]),
                                             s))]
    assert len(subs) == 18
    for name, run in runs.items():
        assert readback.drawn(figs["tsr_by_sub_category"])[name] == [run["by_sub_category"][s]["task_solving_rate"]
                                                                  for s in subs]
        assert readback.drawn(figs["tsr_by_length"])[name] == [run["by_length_bin"][b]["task_solving_rate"]
                                                            for b in LENGTH_BINS]
        assert readback.drawn(figs["near_miss"])[name] == [run["near_miss"][b] for b in NEAR_MISS_BINS]
        assert readback.drawn(figs["rubric_type_failure"])[name] == [run["rubric_type_failure"][t]
                                                                  for t in RUBRIC_TYPES]
    # Table 13's counts, as the paper prints them
    assert readback.drawn(figs["near_miss"])["baseline"] == [183, 243, 567, 700, 206]
    assert readback.drawn(figs["near_miss"])["contextguard"] == [263, 205, 584, 666, 181]
    _, matrix = plots.migration_figure(table14.comparison("baseline", "contextguard"))
    assert matrix == [list(row) for row in TABLE_14.values()]
    # every TSR bar carries its 95% interval as an error bar, read back from the figure
    for name, run in runs.items():
        assert readback.error_bars(figs["tsr_by_sub_category"])[name] == [
            tuple(run["by_sub_category"][s]["task_solving_rate_ci95"]) for s in subs]
        assert readback.error_bars(figs["tsr_by_length"])[name] == [
            tuple(run["by_length_bin"][b]["task_solving_rate_ci95"]) for b in LENGTH_BINS]
    # the value axis starts at zero and leaves the widest interval room for its label
    ax = figs["tsr_by_sub_category"].axes[0]
    highest = max(c["task_solving_rate_ci95"][1] for r in runs.values() for c in r["by_sub_category"].values())
    assert highest == 23.33 and ax.get_xlim()[0] == 0 and highest < ax.get_xlim()[1] < 1.3 * highest
    ax = figs["tsr_by_length"].axes[0]
    deltas = [t.get_text() for t in ax.texts if t.get_text().startswith("Δ")]
    assert len(deltas) == len(LENGTH_BINS) and all(t.get_position()[1] < ax.get_ylim()[1] for t in ax.texts)
    # the gain in each bin with its paired interval, as the report's comparison has it
    gains = table14.to_dict()["comparison"]["by_length_bin"]
    assert deltas == [f"Δ {gains[b]['delta_task_solving_rate']:+.1f}\n"
                      f"[{gains[b]['delta_task_solving_rate_ci95'][0]:+.1f}, "
                      f"{gains[b]['delta_task_solving_rate_ci95'][1]:+.1f}]" for b in LENGTH_BINS]
    values = {t.get_text() for t in ax.texts}
    assert {f"{runs['contextguard']['by_length_bin'][b]['task_solving_rate']:.1f}" for b in LENGTH_BINS} <= values


def test_three_methods_keep_their_colours_and_labels_in_every_figure():
    rep = analysis.report(runs_by_label(three_methods()))
    assert list(rep.runs) == ["baseline", "self-refine", "contextguard"]
    figs = plots.figures(rep)
    assert "migration" not in figs  # no pair: no migration
    for stem, fig in figs.items():
        assert readback.overlapping_text(fig) == [], stem
        colours = {}
        for container in (c for ax in fig.axes for c in ax.containers if isinstance(c, BarContainer)):
            colours[container.get_label()] = container.patches[0].get_facecolor()
        assert colours == {n: plots.matplotlib.colors.to_rgba(plots.colour(n)) for n in rep.runs}, stem
    ax = figs["tsr_by_length"].axes[0]  # the gain written is ContextGuard's over the baseline
    gains = [t.get_text() for t in ax.texts if t.get_text().startswith("Δ")]
    tsr = {n: [r.by_length_bin[b].task_solving_rate for b in LENGTH_BINS] for n, r in rep.runs.items()}
    assert gains == [f"Δ {c - b:+.1f}" for b, c in zip(tsr["baseline"], tsr["contextguard"])]
    assert len({plots.colour(n) for n in ("baseline", "self-refine", "contextguard", "contextguard (no guard)",
                                          "contextguard (no protection)", "contextguard (no reminder)")}) == 6


def test_one_length_bin_still_shows_bars_values_and_the_gain():
    rows = [{"idx": f"t{i}", "messages": [{"role": "user", "content": "short"}], "rubrics": ["r1", "r2"],
             "metadata": {"task_id": f"t{i}", "context_id": "c", "context_category": "Domain Knowledge Reasoning",
                          "sub_category": "Science"},
             "requirement_status": ["yes", "yes" if i < 3 else "no"], "method": m}
            for m in ("baseline", "contextguard") for i in range(5 if m == "baseline" else 6)]
    for r in rows:
        r["score"] = int(all(s == "yes" for s in r["requirement_status"]))
    rep = analysis.report(runs_by_label({"a.jsonl": rows[:5], "b.jsonl": rows[5:]}))
    fig = plots.length_figure(rep)
    assert readback.drawn(fig) == {"baseline": [60.0], "contextguard": [50.0]}
    assert "Δ -10.0" in [t.get_text() for t in fig.axes[0].texts] and readback.overlapping_text(fig) == []


def test_html_report_holds_every_table_and_figure_inline(table14, tmp_path):
    page = html.to_html(table14)
    for t in markdown.tables(table14):
        assert f">{t.title}</h{t.level}>" in page.replace("&gt;", ">").replace("&amp;", "&")
    images = re.findall(r'<img alt="[^"]*" src="([^"]+)"', page)
    assert len(images) == len(plots.figures(table14)) == 5
    assert all(src.startswith("data:image/png;base64,") for src in images)
    assert not re.search(r"(src|href)=\"(https?:)?//", page)  # nothing fetched from a network
    assert "<td>9.64</td>" in page and "<td>13.85</td>" in page


def test_report_html_from_the_cli_and_it_never_overwrites_a_file_that_is_not_a_report(tmp_path):
    before, after = table14_rows()
    paths = []
    for name, rows in (("before.jsonl", before[:200]), ("after.jsonl", after[:200])):
        paths.append(tmp_path / name)
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    page, plots_dir = tmp_path / "report.html", tmp_path / "plots"
    done = cli("report", *map(str, paths), "--html", str(page), "--plots", str(plots_dir), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in plots_dir.iterdir()) == sorted(f"{s}.png" for s in (
        "tsr_by_sub_category", "tsr_by_length", "near_miss", "rubric_type_failure", "migration"))
    assert page.read_text().count("<img ") == 5
    assert cli("report", *map(str, paths), "--html", str(page)).returncode == 0  # ours: replaced
    notes = tmp_path / "notes.html"
    notes.write_text("<html>my notes</html>")
    done = cli("report", *map(str, paths), "--html", str(notes))
    assert done.returncode == 2 and "not a contextguard report" in done.stderr
    assert notes.read_text() == "<html>my notes</html>"


def test_runs_that_would_share_a_colour_get_their_own_and_long_labels_stay_inside():
    before, after = table14_rows()
    files = {"a/baseline.graded.jsonl": before, "b/baseline.graded.jsonl": before,
             "cg-ablate3-seed1.graded.jsonl": [
                 dict(r, cg_dspy={"generation": {"config": {"ablate": ["audit", "protection", "reminder"]}}})
                 for r in after]}
    rep = analysis.report(runs_by_label(files))
    assert list(rep.runs) == ["baseline [a/baseline.graded.jsonl]", "baseline [b/baseline.graded.jsonl]",
                                 "contextguard (no audit, no protection, no reminder)"]
    for stem, fig in plots.figures(rep).items():
        assert readback.overlapping_text(fig) == [], stem
        faces = [c.patches[0].get_facecolor() for ax in fig.axes for c in ax.containers if isinstance(c, BarContainer)]
        assert len(set(faces)) == len(faces) == 3, stem
    many = plots._colours([f"run{i}.jsonl" for i in range(12)])
    assert len(set(many.values())) == 12
    assert plots.colour("contextguard (no audit) [x.jsonl]") == plots.ABLATION_COLOURS["audit"]


def test_figures_never_write_through_links_or_over_files_that_are_not_ours(table14, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "near_miss.png").symlink_to(victim)
    with pytest.raises(OutputRefused, match="symbolic link"):
        plots.write_all(table14, linked)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "migration.png").write_bytes(b"\x89PNG their own figure")
    with pytest.raises(OutputRefused, match="not a contextguard figure"):
        plots.write_all(table14, theirs)
    assert victim.read_text() == "mine" and (theirs / "migration.png").read_bytes() == b"\x89PNG their own figure"
    ours = tmp_path / "ours"
    plots.write_all(table14, ours)
    (ours / "migration_old_run.png").write_bytes((ours / "migration.png").read_bytes())  # an earlier report's
    written = plots.write_all(table14, ours)  # ours: replaced; the stale one removed
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in written)


def test_a_refused_html_target_stops_report_before_any_side_effect(tmp_path):
    before, after = table14_rows()
    graded = tmp_path / "g.jsonl"
    graded.write_text("".join(json.dumps(r) + "\n" for r in before[:50]))
    notes = tmp_path / "notes.html"
    notes.write_text("<html>mine</html>")
    done = cli("report", str(graded), "--plots", str(tmp_path / "p"), "--html", str(notes))
    assert done.returncode == 2 and "not a contextguard report" in done.stderr and done.stdout == ""
    assert not (tmp_path / "p").exists()
    done = cli("report", str(graded), "--plots", str(notes))
    assert done.returncode == 2 and "names a folder" in done.stderr and "internal error" not in done.stderr
