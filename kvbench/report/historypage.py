"""The history page: one self-contained HTML file of inline SVG, CSS and a few lines of script.

Nothing is fetched: no stylesheet, font, image or script leaves the file, so it opens from disk on a
machine without a network (asv publish's pages load jQuery and flot from CDNs and stay blank there).
Each chart draws one line per machine across the commits, every point with its 95% interval; a
triangle between two points marks a step kvbench judged slower (up, red) or faster (down, green),
a hollow circle one within noise or unchanged; a dashed flag marks where that machine's captured
environment changed. Every mark has a tooltip, and the tables under each chart say it in words.
"""

from __future__ import annotations

import math

from kvbench.report.compare import FASTER, SLOWER
from kvbench.report.format import escape_html
from kvbench.report.history import Chart, EnvironmentMark, History, Point, Step

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
STEP_COLORS = {SLOWER: "#c0392b", FASTER: "#1e8449"}
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:820px;color:#222}
h1{font-size:1.4em}h2{font-size:1.1em;margin:1.6em 0 .3em}table{border-collapse:collapse;margin:.4em 0 1em}
td,th{border-bottom:1px solid #ddd;padding:2px 8px;text-align:left;font-size:13px}
.chart{margin-bottom:2em}.legend span{margin-right:1.2em}.swatch{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:middle}.slower{color:#c0392b;font-weight:600}.faster{color:#1e8449;font-weight:600}
.muted{color:#777}svg text{font:11px system-ui,sans-serif}code{font-size:12px}
"""
SCRIPT = """
document.getElementById("filter").addEventListener("input", function (event) {
  var words = event.target.value.toLowerCase();
  document.querySelectorAll(".chart").forEach(function (chart) {
    chart.hidden = chart.dataset.title.toLowerCase().indexOf(words) < 0;
  });
});
document.body.dataset.ready = "yes";
"""


def color_of(history: History, machine: str) -> str:
    return COLORS[history.machines.index(machine) % len(COLORS)]


def scale_of(chart: Chart) -> tuple[float, str]:
    """A factor and unit that make the numbers readable (seconds become ms or µs)."""
    if chart.unit != "seconds":
        return 1.0, chart.unit
    values = [p.value for points in chart.series.values() for p in points if p.value is not None]
    largest = max(values, default=1.0)
    return (1.0, "s") if largest >= 1 else (1e3, "ms") if largest >= 1e-3 else (1e6, "µs")


def value_range(chart: Chart) -> tuple[float, float]:
    numbers = []
    for points in chart.series.values():
        for p in points:
            if p.value is not None:
                numbers += [p.value] + ([p.estimate.low, p.estimate.high] if p.estimate else [])
    low, high = (min(numbers), max(numbers)) if numbers else (0.0, 1.0)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    return low - pad, high + pad


class Frame:
    """Data coordinates to SVG coordinates for one chart."""

    def __init__(self, history: History, chart: Chart) -> None:
        self.commits = [c.hash for c in history.commits]
        self.low, self.high = value_range(chart)
        self.factor, self.unit = scale_of(chart)

    def x(self, commit: str) -> float:
        span = WIDTH - LEFT - RIGHT
        return LEFT + span * (self.commits.index(commit) + 0.5) / len(self.commits)

    def y(self, value: float) -> float:
        return TOP + (HEIGHT - TOP - BOTTOM) * (self.high - value) / (self.high - self.low)

    def text(self, value: float) -> str:
        return f"{value * self.factor:.4g}"

    def ticks(self) -> list[float]:
        """Round values (1, 2 or 5 times a power of ten apart) inside the axis, three to six of them."""
        raw = (self.high - self.low) / 6
        power = 10 ** math.floor(math.log10(raw))
        step = next(power * m for m in (1, 2, 5, 10) if power * m >= raw)
        first = math.ceil(self.low / step)
        return [k * step for k in range(first, math.floor(self.high / step) + 1)]


def axes(frame: Frame) -> list[str]:
    out = [f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{HEIGHT - BOTTOM}" stroke="#999"/>',
           f'<line x1="{LEFT}" y1="{HEIGHT - BOTTOM}" x2="{WIDTH - RIGHT}" y2="{HEIGHT - BOTTOM}" stroke="#999"/>']
    for value in frame.ticks():
        y = frame.y(value)
        out.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{frame.text(value)}</text>')
    for commit in frame.commits:
        x = frame.x(commit)
        out.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{escape_html(commit[:8])}</text>')
    out.append(f'<text x="14" y="{TOP + 10}" transform="rotate(-90 14 {TOP + 10})" text-anchor="end">'
               f'{escape_html(frame.unit)}</text>')
    return out


def point_marks(frame: Frame, points: list[Point], color: str, machine: str, counted: str) -> list[str]:
    out, line = [], [p for p in points if p.value is not None]
    if len(line) > 1:
        path = " ".join(f"{frame.x(p.commit):.1f},{frame.y(p.value):.1f}" for p in line)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
    for p in line:
        x, y = frame.x(p.commit), frame.y(p.value)
        tip = f"{machine} @ {p.commit[:8]}: {frame.text(p.value)} {frame.unit}"
        if p.estimate is not None:
            low, high = frame.y(p.estimate.low), frame.y(p.estimate.high)
            out.append(f'<path d="M{x - 4:.1f},{high:.1f}H{x + 4:.1f}M{x:.1f},{high:.1f}V{low:.1f}M{x - 4:.1f},'
                       f'{low:.1f}H{x + 4:.1f}" stroke="{color}" fill="none"/>')
            tip += f" [{frame.text(p.estimate.low)}, {frame.text(p.estimate.high)}] 95% CI, {p.samples} {counted}"
        elif p.note:
            tip += f" ({p.note})"
        out.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}">'
                   f'<title>{escape_html(tip)}</title></circle>')
    return out


def step_text(step: Step) -> str:
    if step.judged is None:
        return f"not judged: {step.reason}"
    j = step.judged
    return f"{step.verdict}: {j.ratio:.3f} [{j.low:.3f}, {j.high:.3f}] new/old, MDE ±{j.mde:.1%}"


def step_marks(frame: Frame, chart: Chart, color_for) -> list[str]:
    out = []
    for step in chart.steps:
        points = {p.commit: p for p in chart.series[step.machine]}
        old, new = points[step.old], points[step.new]
        x = (frame.x(step.old) + frame.x(step.new)) / 2
        y = (frame.y(old.value) + frame.y(new.value)) / 2
        tip = escape_html(f"{step.machine} {step.old[:8]} → {step.new[:8]}: {step_text(step)}")
        if step.verdict in STEP_COLORS:
            up = step.verdict == SLOWER
            tip_y, base_y = (y - 8, y + 5) if up else (y + 8, y - 5)
            out.append(f'<polygon class="step {step.verdict}" points="{x - 6:.1f},{base_y:.1f} {x + 6:.1f},'
                       f'{base_y:.1f} {x:.1f},{tip_y:.1f}" fill="{STEP_COLORS[step.verdict]}"><title>{tip}</title>'
                       f'</polygon>')
        else:
            out.append(f'<circle class="step" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="white" '
                       f'stroke="{color_for(step.machine)}"><title>{tip}</title></circle>')
    return out


def environment_flags(frame: Frame, marks: list[EnvironmentMark], color_for) -> list[str]:
    out = []
    for mark in marks:
        if mark.new not in frame.commits:
            continue
        x = frame.x(mark.new) - 6
        tip = escape_html(f"{mark.machine}: environment changed {mark.old[:8]} → {mark.new[:8]}: "
                          + "; ".join(f"{d.key} {d.old} → {d.new}" for d in mark.differences))
        color = color_for(mark.machine)
        out.append(f'<g class="environment-mark"><line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" '
                   f'stroke="{color}" stroke-dasharray="4 3"/><text x="{x + 3:.1f}" y="{TOP + 10}" fill="{color}">'
                   f'env</text><title>{tip}</title></g>')
    return out


def chart_svg(history: History, chart: Chart) -> str:
    frame = Frame(history, chart)
    color_for = lambda machine: color_of(history, machine)  # noqa: E731
    parts = axes(frame) + environment_flags(frame, history.marks, color_for)
    for machine, points in chart.series.items():
        parts += point_marks(frame, points, color_for(machine), machine, "rotations" if chart.higher_is_better else
                             "samples")
    parts += step_marks(frame, chart, color_for)
    return (f'<svg width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} '
            f'{HEIGHT}" role="img" aria-label="{escape_html(chart.title)}">' + "".join(parts) + "</svg>")


def steps_table(chart: Chart) -> str:
    if not chart.steps:
        return '<p class="muted">one commit per machine: no step to judge</p>'
    rows = []
    for step in chart.steps:
        css = step.verdict if step.verdict in STEP_COLORS else "muted"
        rows.append(f"<tr><td>{escape_html(step.machine)}</td><td><code>{step.old[:8]} → {step.new[:8]}</code></td>"
                    f'<td class="{css}">{escape_html(step_text(step))}</td></tr>')
    return "<table><tr><th>machine</th><th>step</th><th>kvbench's verdict</th></tr>" + "".join(rows) + "</table>"


def legend(history: History) -> str:
    machines = "".join(f'<span><i class="swatch" style="background:{color_of(history, m)}"></i>{escape_html(m)}</span>'
                       for m in history.machines)
    return (f'<p class="legend">{machines}</p><p class="muted">Points: the value with its 95% confidence interval. '
            f'<span class="slower">▲</span> slower, <span class="faster">▼</span> faster: beyond the minimum '
            f'detectable effect and {history.factor:g}x, as <code>kvbench compare</code> judges (a drop in speedup '
            'is slower); ○ within noise or unchanged; dashed <i>env</i>: that machine\'s captured environment '
            'changed. Hover any mark for its numbers.</p>')


def commits_table(history: History) -> str:
    import datetime

    rows = []
    for commit in history.commits:
        when = (datetime.datetime.fromtimestamp(commit.date / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
                if commit.date else "")
        rows.append(f"<tr><td><code>{escape_html(commit.hash)}</code></td><td>{when} UTC</td></tr>")
    return "<table><tr><th>commit</th><th>date</th></tr>" + "".join(rows) + "</table>"


def marks_table(history: History) -> str:
    if not history.marks:
        return '<p class="muted">No captured environment changed between two commits of one machine.</p>'
    rows = []
    for mark in history.marks:
        for d in mark.differences:
            rows.append(f"<tr><td>{escape_html(mark.machine)}</td><td><code>{mark.old[:8]} → {mark.new[:8]}</code></td>"
                        f"<td>{escape_html(d.rank)}</td><td><code>{escape_html(d.key)}</code></td>"
                        f"<td>{escape_html(d.old)} → {escape_html(d.new)}</td></tr>")
    return ("<table><tr><th>machine</th><th>commits</th><th>rank</th><th>fact</th><th>old → new</th></tr>"
            + "".join(rows) + "</table>")


def chart_section(history: History, chart: Chart) -> str:
    return (f'<section class="chart" data-title="{escape_html(chart.title)}"><h2>{escape_html(chart.title)}</h2>'
            f"{chart_svg(history, chart)}{steps_table(chart)}</section>")


def render_page(history: History) -> str:
    notes = "".join(f"<li>{escape_html(note)}</li>" for note in history.notes)
    return "".join([
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
        'script-src \'unsafe-inline\'">',
        f"<title>kvbench history: {escape_html(history.results_dir)}</title><style>{STYLE}</style></head><body>",
        f"<h1>kvbench history of <code>{escape_html(history.results_dir)}</code></h1>",
        f"<p>{len(history.charts)} benchmark × parameter charts, {len(history.machines)} machine(s), "
        f"{len(history.commits)} commit(s). Generated by <code>kvbench history</code>; this file loads nothing "
        "from anywhere.</p>",
        legend(history), "<h2>Commits</h2>", commits_table(history),
        "<h2>Environment changes</h2>", marks_table(history),
        f"<ul class=\"muted\">{notes}</ul>" if notes else "",
        '<p><label>Filter charts: <input id="filter" type="search" placeholder="e.g. static"></label></p>',
        *(chart_section(history, chart) for chart in history.charts),
        f"<script>{SCRIPT}</script></body></html>\n",
    ])
