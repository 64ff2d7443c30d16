"""The HTML layout of one record's report: one self-contained page (inline CSS, images as data: URIs,
no scripts, no URL), kvbench.report.record.sections each rendered by one table renderer.

The page is built as `Html` (kvbench.report.format), markup that escapes whatever is formatted into it
or joined with it, so no text from a record can become an element; its Content-Security-Policy loads
nothing and runs no script. The sections' semantic styles become CSS classes.
"""

from __future__ import annotations

import base64

from kvbench.report.format import Html, as_sentence, capitalised, format_bytes
from kvbench.report.record.model import MARKS, Report, environment_line
from kvbench.report.record.plots import caption
from kvbench.report.record.sections import Cell, Column, Section, sections

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f;
       max-width: 1180px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.meta { color: #555; margin: 2px 0; }
.banner { background: #fff3cd; border: 1px solid #e0b000; padding: 8px 12px; font-weight: 600; margin: 12px 0; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; font-size: 13.5px; }
.scroll { overflow-x: auto; }
th, td { padding: 3px 7px; border-bottom: 1px solid #e4e4e4; text-align: right; white-space: nowrap; }
th { background: #f4f4f6; } td.l, th.l { text-align: left; }
tr.first td { border-top: 2px solid #c8c8cc; }
td.failed { background: #fde2e1; color: #a40000; font-weight: 600; }
td.noisy { background: #fff6d6; }
.mark-failed { color: #c00000; font-weight: 700; } .mark-noisy { color: #a07000; font-weight: 700; }
.mark-partial, .mark-unquantized { color: #8a2be2; font-weight: 700; } .mark-trend, .mark-disturbed { color: #a07000; font-weight: 700; }
.legend, .note { color: #444; font-size: 13.5px; } .verdict { margin: 10px 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px; }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; font-size: 13px; }
code { background: #f4f4f6; padding: 0 3px; }
"""
POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"  # loads nothing, runs no script
CLASSES = {"failed": "failed", "invalid": "failed", "noisy": "noisy"}


def data_uri(content: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(content).decode('ascii')}"


def fact_text(key: str, value: object) -> str:
    if value is None:
        return "—"
    return format_bytes(value) if key.endswith("_bytes") and isinstance(value, int) else str(value)


def mark_symbols(names: tuple[str, ...]) -> Html:
    return Html(" ").join(Html('<span class="mark-{name}" title="{meaning}">{symbol}</span>').format(
        name=name, meaning=MARKS[name][1], symbol=MARKS[name][0]) for name in names)


def cell_html(column: Column, cell: Cell, blank: bool = False) -> Html:
    classes = (["l"] if column.left else []) + ([CLASSES[cell.style]] if cell.style in CLASSES else [])
    content = Html() if blank else mark_symbols(cell.marks) if cell.marks else cell.text
    if classes:
        return Html('<td class="{}">{}</td>').format(" ".join(classes), content)
    return Html("<td>{}</td>").format(content)


def table_html(section: Section) -> Html:
    """The section's table; a grouped section marks where its first cell changes and prints it only there."""
    head = Html("").join(Html('<th class="l">{}</th>' if column.left else "<th>{}</th>").format(column.name)
                         for column in section.columns)
    body, previous = [], None
    for row in section.rows:
        first = section.grouped and row[0].text != previous
        cells = Html("").join(cell_html(column, cell, section.grouped and not first and index == 0)
                              for index, (column, cell) in enumerate(zip(section.columns, row)))
        body.append(Html('<tr class="first">{}</tr>' if first else "<tr>{}</tr>").format(cells))
        previous = row[0].text
    return Html('<div class="scroll"><table><thead><tr>{}</tr></thead><tbody>{}</tbody></table></div>').format(
        head, Html("").join(body))


def section_html(section: Section, skip_warnings: int = 0) -> list[Html]:
    """Any section: its title as a heading, its table, its note as a sentence, its items as a list, the marks it
    explains, its warnings (the first `skip_warnings` already said by the page's banner)."""
    parts = [Html("<h2>{}</h2>").format(capitalised(section.title))] if section.title else []
    if section.columns:
        parts.append(table_html(section))
    if section.note:
        parts.append(Html('<p class="legend">{}</p>').format(as_sentence(section.note)))
    if section.items:
        parts.append(Html("<ul>{}</ul>").format(Html("").join(Html("<li>{}</li>").format(item) for item in section.items)))
    if section.marks:
        parts.append(Html('<p class="legend">{}</p>').format(Html("<br>").join(
            Html("{} {}").format(mark_symbols((name,)), MARKS[name][1]) for name in section.marks)))
    parts += [Html('<p class="note"><strong>Note:</strong> {}</p>').format(warning)
              for warning in section.warnings[skip_warnings:]]
    return parts


def render_report(report: Report, images: dict[str, tuple[bytes, str]]) -> str:
    """One self-contained page: inline CSS, images as data: URIs, no scripts, no external URL."""
    parts = [Html('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                  '<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
                  "<title>{title}</title><style>{css}</style></head><body>\n<h1>{title}</h1>").format(
                 policy=POLICY, title=report.title, css=Html(CSS)),
             Html('<p class="meta">record <code>{}</code> · created {}</p>').format(report.source, report.created_utc),
             Html('<p class="meta">{}</p>').format(environment_line(report.environment))]
    if report.verdict:
        parts.append(Html('<p class="verdict"><strong>{}</strong></p>').format(as_sentence(report.verdict)))
    if not report.complete:
        parts.append(Html('<div class="banner">INCOMPLETE record: the run was interrupted; only the completed '
                          "repetitions are reported (cells marked †).</div>"))
    for section in sections(report):
        parts += section_html(section, skip_warnings=0 if report.complete else 1)
    parts += plots_html(images, report)
    facts = [(key, fact_text(key, value)) for key, value in report.environment.items()]
    parts += section_html(Section("environment", "environment", (Column("key", True), Column("value", True)),
                                  tuple((Cell(key), Cell(value)) for key, value in facts)))
    parts.append(Html('<p class="meta">command: <code>{}</code></p>').format(" ".join(report.command)))
    parts.append(Html("</body></html>"))
    return str(Html("\n").join(parts)) + "\n"


def plots_html(images: dict[str, tuple[bytes, str]], report: Report) -> list[Html]:
    """The plots, where the layout places them: after the sections, each with its caption."""
    if not images:
        return []
    figures = [Html('<figure><img src="{uri}" alt="{alt}"><figcaption>{text}</figcaption></figure>').format(
        uri=data_uri(content, mime), alt=caption(name, report) or name, text=caption(name, report))
        for name, (content, mime) in images.items()]
    return [Html('<h2>Plots</h2><div class="grid">{}</div>').format(Html("").join(figures))]
