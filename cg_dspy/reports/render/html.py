"""The report as one self-contained HTML page: every table and every figure inline (PNG
as data URIs), no script and no network, so it opens anywhere and can be mailed."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from cg_dspy.core import files
from cg_dspy.core.files import OutputRefused
from cg_dspy.reports.render import markdown, plots
from cg_dspy.reports.report import Report

GENERATOR = '<meta name="generator" content="contextguard report">'
PAGE = files.Kind("a contextguard report page", GENERATOR.encode())

STYLE = """body{font:15px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th:first-child,td:first-child{text-align:left}th{background:#f3f3f3}figure{margin:1em 0 2em}
img{max-width:100%;height:auto;border:1px solid #eee}figcaption{color:#555;font-size:13px}
.note{color:#555}nav a{margin-right:1em}"""


def _table(t: markdown.Table) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in t.header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(markdown.cell(v))}</td>" for v in row) + "</tr>"
                   for row in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>" if t.header else ""


def to_html(report: Report, *, title: str = "ContextGuard report", drawn: dict | None = None) -> str:
    """The page: figures first (what a reader looks at), then every table of the report;
    `drawn` (from `plots.rendered`) saves drawing the figures again."""
    figures = []
    for stem, figure in (drawn or plots.rendered(report)).items():
        src = "data:image/png;base64," + base64.b64encode(figure.png).decode("ascii")
        figures.append(f'<figure id="{stem}"><img alt="{html.escape(figure.caption)}" src="{src}">'
                       f"<figcaption>{html.escape(figure.caption)}</figcaption></figure>")
    sections = []
    for t in markdown.tables(report):
        note = f'<p class="note">{html.escape(t.note)}</p>' if t.note else ""
        sections.append(f"<h{t.level}>{html.escape(t.title)}</h{t.level}>{_table(t)}{note}")
    runs = ", ".join(html.escape(n) for n in report.runs)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"{GENERATOR}<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1><p>Runs: {runs}</p>"
            '<nav><a href="#figures">Figures</a><a href="#tables">Tables</a></nav>'
            f'<h2 id="figures">Figures</h2>{"".join(figures)}<div id="tables">{"".join(sections)}</div>'
            "</body></html>\n")


def check(path: str | Path) -> Path:
    """Refuse, before any work, a target that is not an .html name or not a page of ours."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise OutputRefused(f"{path}: --html names an .html file")
    return files.check(path, PAGE)


def write(report: Report, path: str | Path, drawn: dict | None = None) -> Path:
    """Write the page whole; an existing file is replaced only if it is one of ours."""
    check(path)
    return files.write(path, to_html(report, drawn=drawn).encode("utf-8"), PAGE)
