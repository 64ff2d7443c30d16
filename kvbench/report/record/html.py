"""The HTML layout: one self-contained page (inline CSS, images as data: URIs, no scripts, no URL).

Every text that comes from a record is escaped; the table's semantic styles become CSS classes.
"""

from __future__ import annotations

import base64

from kvbench.report.record import columns
from kvbench.report.format import as_sentence, escape_html, format_bytes
from kvbench.report.record.latency import (
    CONTEXT_COLUMNS,
    context_cells,
    LATENCY_COLUMNS,
    LIMIT_COLUMNS,
    peer_columns,
    PEER_NOTE,
    latency_cells,
    limit_cells,
    peer_cells,
)
from kvbench.report.record.model import MARKS, Report, Row, environment_line
from kvbench.report.record.precision import CLOCK_TEXTS
from kvbench.report.record.plots import caption

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
.mark-partial { color: #8a2be2; font-weight: 700; } .mark-trend, .mark-disturbed { color: #a07000; font-weight: 700; }
.legend, .note { color: #444; font-size: 13.5px; } .verdict { margin: 10px 0; }
.grid { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 16px; }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; font-size: 13px; }
code { background: #f4f4f6; padding: 0 3px; }
"""


CLASSES = {"failed": "failed", "invalid": "failed", "noisy": "noisy"}


def data_uri(content: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(content).decode('ascii')}"


def _fact(key: str, value: object) -> str:
    if value is None:
        return "—"
    return format_bytes(value) if key.endswith("_bytes") and isinstance(value, int) else str(value)


def _td(content: str, classes: list[str]) -> str:
    return f'<td class="{" ".join(classes)}">{content}</td>' if classes else f"<td>{content}</td>"


def _row_cell(column: columns.Column, row: Row, first: bool) -> str:
    style = column.style(row)
    if style == "marks":
        content = " ".join(f'<span class="mark-{m}" title="{escape_html(MARKS[m][1])}">{escape_html(MARKS[m][0])}'
                           "</span>" for m in row.marks)
    elif column.name == "length" and not first:
        content = ""
    else:
        content = escape_html(column.text(row))
    classes = (["l"] if column.left else []) + ([CLASSES[style]] if style in CLASSES else [])
    return _td(content, classes)


def _table(header: list[str], body: list[str], left: tuple[str, ...]) -> str:
    out = ['<div class="scroll"><table><thead><tr>']
    out += [f'<th class="l">{escape_html(name)}</th>' if name in left else f"<th>{escape_html(name)}</th>"
            for name in header]
    out.append("</tr></thead><tbody>")
    out += body
    out.append("</tbody></table></div>")
    return "".join(out)


def _rows_table(report: Report, clock: str) -> str:
    """The timing table of the lengths on one clock; its time columns' headers name it."""
    shown, body, previous = columns.row_columns(report, clock, "document"), [], None
    for row in report.rows:
        if row.clock != clock:
            continue
        first = row.length != previous
        body.append(('<tr class="first">' if first else "<tr>")
                    + "".join(_row_cell(column, row, first) for column in shown) + "</tr>")
        previous = row.length
    return _table([c.name for c in shown], body, tuple(c.name for c in shown if c.left))


def _plain_table(header: tuple[str, ...], rows: list[list[str]], left: tuple[str, ...]) -> str:
    body = ["<tr>" + "".join(_td(escape_html(text), ["l"] if name in left else [])
                             for name, text in zip(header, row)) + "</tr>" for row in rows]
    return _table(list(header), body, left)


def render_report(report: Report, images: dict[str, tuple[bytes, str]]) -> str:
    """One self-contained page: inline CSS, images as data: URIs, no scripts, no external URL."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{escape_html(report.title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{escape_html(report.title)}</h1>",
             f'<p class="meta">record <code>{escape_html(report.source)}</code> · created '
             f"{escape_html(report.created_utc)}</p>",
             f'<p class="meta">{escape_html(environment_line(report.environment))}</p>']
    if report.verdict:
        parts.append(f'<p class="verdict"><strong>{escape_html(as_sentence(report.verdict))}</strong></p>')
    parts += _latency_section(report) + _timings_section(report) + _sampling_section(report) + _tradeoff_section(report)
    parts += _fit_section(report) + _profile_section(report) + _plots_section(images, report)
    parts.append("<h2>Environment</h2>")
    facts = [[key, _fact(key, value)] for key, value in report.environment.items()]
    parts.append(_plain_table(("key", "value"), facts, ("key", "value")))
    parts.append(f'<p class="meta">command: <code>{escape_html(" ".join(report.command))}</code></p>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _latency_section(report: Report) -> list[str]:
    parts = []
    if report.latency:
        parts += ["<h2>What a client sees: one request</h2>",
                  _plain_table((*LATENCY_COLUMNS, "marks"),
                               [[*latency_cells(row), columns.marks_of(row)] for row in report.latency],
                               ("mode", "equivalence", "marks")),
                  f'<p class="legend">{escape_html(as_sentence(report.latency_note))}</p>']
    if report.context_steps:
        parts += ["<h2>Steps at a context</h2>",
                  _plain_table((*CONTEXT_COLUMNS, "marks"),
                               [[*context_cells(row), columns.marks_of(row)] for row in report.context_steps],
                               ("mode", "equivalence", "marks")),
                  f'<p class="legend">{escape_html(as_sentence(report.context_note))}</p>']
    if report.limits:
        parts += ["<h2>Against the machine's limits</h2>",
                  _plain_table(LIMIT_COLUMNS, [limit_cells(row) for row in report.limits], ("mode", "step")),
                  f'<p class="legend">{escape_html(as_sentence(report.limits_note))}</p>']
    if report.peers:
        parts += ["<h2>Against transformers' caches on the same weights</h2>",
                  _plain_table(peer_columns(bool(report.context_steps)), [peer_cells(row) for row in report.peers],
                               ("kvbench", "transformers")),
                  f'<p class="legend">{escape_html(as_sentence(PEER_NOTE))}</p>']
    return parts


def _timings_section(report: Report) -> list[str]:
    parts = []
    if not report.complete:
        parts.append('<div class="banner">INCOMPLETE record: the run was interrupted; only the completed '
                     'repetitions are reported (cells marked †).</div>')
    legend = [f'<span class="mark-{m}">{escape_html(MARKS[m][0])}</span> {escape_html(MARKS[m][1])}'
              for m in report.marks_used()]
    if report.kind != "request":  # a request's figures are its latency table's
        parts.append("<h2>Timings and speedups</h2>")
        for clock in report.clocks():
            if len(report.clocks()) > 1:
                parts.append(f"<h3>Times and speedups on {escape_html(CLOCK_TEXTS[clock])}</h3>")
            parts.append(_rows_table(report, clock))
        legend.insert(0, escape_html(as_sentence(columns.speedup_legend(report))))
    if legend:
        parts.append(f'<p class="legend">{"<br>".join(legend)}</p>')
    for note in report.notes[0 if report.complete else 1:]:  # the banner already says INCOMPLETE
        parts.append(f'<p class="note"><strong>Note:</strong> {escape_html(note)}</p>')
    return parts


def _sampling_section(report: Report) -> list[str]:
    parts = []
    if report.sampling:
        parts.append("<h2>Sampling and noise</h2>")
        parts.append(_plain_table(columns.sampling_columns(report),
                                  [columns.sampling_cells(row, report.workload) for row in report.sampling], ("stopped",)))
        parts.append(f'<p class="legend">{escape_html(columns.sampling_sentence(report))}.</p>')
    if report.noise is not None:
        parts.append(f'<p class="legend">{escape_html(columns.noise_sentence(report.noise))}.</p>')
    return parts


def _tradeoff_section(report: Report) -> list[str]:
    if not report.tradeoffs:
        return []
    return ["<h2>Trade-off: bytes, drift, time</h2>",
            _plain_table(columns.TRADEOFF_COLUMNS, [columns.tradeoff_cells(entry) for entry in report.tradeoffs], ("mode", "judged")),
            f'<p class="legend">{escape_html(columns.TRADEOFF_SENTENCE)}</p>']


def _fit_section(report: Report) -> list[str]:
    if not report.fits:  # fewer than three lengths: no slope worth a table
        return []
    return ["<h2>Scaling fit: time ≈ a · T<sup>b</sup></h2>",
            _plain_table(columns.FIT_COLUMNS, [[mode, *columns.fit_cells(fit)] for mode, fit in report.fits.items()], ("mode",)),
            '<p class="legend">Least squares on log(median time) against log(length). A full-prefix loop '
            "grows like T² to T³, a cached loop like T to T²; fixed overhead at short lengths pulls b down, "
            "so the slope between the two longest lengths shows where the growth is heading.</p>"]


def _profile_section(report: Report) -> list[str]:
    if report.profile is None and report.kind != "loop":
        return []
    if report.profile is None:
        return ["<h2>Per-step profile</h2>", '<p class="note">No per-step profile in this record; '
                "<code>kvbench run --per-step LENGTH</code> records one.</p>"]
    head, *rest = columns.profile_sentences(report.profile, report.baseline)
    return ["<h2>Per-step profile</h2>", f"<p>{escape_html(head[0].upper() + head[1:])}</p><ul>",
            *(f"<li>{escape_html(line.strip())}</li>" for line in rest), "</ul>"]


def _plots_section(images: dict[str, tuple[bytes, str]], report: Report) -> list[str]:
    if not images:
        return []
    parts = ['<h2>Plots</h2><div class="grid">']
    for name, (content, mime) in images.items():
        text = caption(name, report)
        parts.append(f'<figure><img src="{data_uri(content, mime)}" alt="{escape_html(text or name)}">'
                     f"<figcaption>{escape_html(text)}</figcaption></figure>")
    parts.append("</div>")
    return parts
