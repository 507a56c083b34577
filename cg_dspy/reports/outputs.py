"""A report's folder (what `bench` writes): `report.json`, `report.md`, `report.html`
and `figures/`. Every file is checked before any work (a link or a file that is not
ours is refused), rendered in memory, then written whole in one uninterrupted step, so
an interrupt leaves the old report or the new one, not a mix."""

from __future__ import annotations

import json
from pathlib import Path

from cg_dspy.core import files
from cg_dspy.reports.render import html, markdown, plots
from cg_dspy.reports.report import Report

GENERATOR = "contextguard report"
JSON_REPORT = files.json_kind("a contextguard JSON report", lambda v: isinstance(v, dict) and v.get("generator") ==
                              GENERATOR, marker=f'"generator": "{GENERATOR}"'.encode())


def check(out_dir: str | Path) -> Path:
    """Refuse, before any work, a folder whose report files are not ours."""
    out_dir = Path(out_dir)
    files.check(out_dir / "report.json", JSON_REPORT)
    files.check(out_dir / "report.md", markdown.KIND)
    html.check(out_dir / "report.html")
    plots.check(out_dir / "figures")
    return out_dir


def as_json(report: Report) -> str:
    """The report as JSON, marked as ours."""
    return json.dumps({"generator": GENERATOR, **report.to_dict()}, indent=1) + "\n"


def write(report: Report, out_dir: str | Path) -> None:
    """Every report file of `out_dir`, rendered first, then written in one step."""
    out_dir = check(out_dir)
    drawn = plots.rendered(report)  # drawn once, for the folder and the page
    page = html.to_html(report, drawn=drawn).encode("utf-8")
    with files.uninterrupted():
        files.write(out_dir / "report.json", as_json(report).encode("utf-8"), JSON_REPORT)
        files.write(out_dir / "report.md", markdown.to_markdown(report).encode("utf-8"), markdown.KIND)
        plots.write_all(report, out_dir / "figures", drawn)
        files.write(out_dir / "report.html", page, html.PAGE)
