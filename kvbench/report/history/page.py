"""The history page: one self-contained HTML file of inline SVG, CSS and a few lines of script.

Nothing is fetched: no stylesheet, font, image or script leaves the file, so it opens from disk on a
machine without a network (asv publish's pages load jQuery and flot from CDNs and stay blank there).
Each chart draws one line per machine across the commits, every point with its 95% interval; a
triangle between two points marks a step kvbench judged slower (up, red) or faster (down, green),
a hollow circle one within noise or unchanged, a dashed grey ring one not judged (no interval on one
side); a dashed flag marks where that machine's captured
environment changed. Every mark has a tooltip, and the tables under each chart say it in words.

Every string on the page comes from files anyone with push access to a results repository writes
(commit hashes, machine folders, benchmark and parameter names, environment facts), so the page is
built as `Html`, markup that escapes whatever is formatted into it or joined with it unless it is
`Html` already: a value can only ever become text, and a forgotten escape shows up as visible tags,
never as an element. The page's own script is allowed by its hash in the Content-Security-Policy; no
other script, inline or not, would run.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import math

from kvbench.report.comparison.compare import FASTER, SLOWER
from kvbench.report.format import Html, seconds_unit
from kvbench.report.history.charts import Chart, EnvironmentMark, History, Point, Step

WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
STEP_COLORS = {SLOWER: "#c0392b", FASTER: "#1e8449"}
# Written on one line in the page (its lines end where a rule or value does, so dropping the breaks keeps it)
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


def script_hash(script: str) -> str:
    """The CSP source that allows exactly this inline script: 'sha256-<base64 of its UTF-8 digest>'."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def content_security_policy(script: str) -> str:
    """Nothing loads; inline styles (the swatches' colours) apply; the one script with this hash runs."""
    return f"default-src 'none'; style-src 'unsafe-inline'; script-src {script_hash(script)}"


def color_of(history: History, machine: str) -> str:
    return COLORS[history.machines.index(machine) % len(COLORS)]


def scale_of(chart: Chart) -> tuple[float, str]:
    """A factor and unit that make the numbers readable (seconds become ms or µs)."""
    if chart.unit != "seconds":
        return 1.0, chart.unit
    values = [p.value for points in chart.series.values() for p in points if p.value is not None]
    return seconds_unit(values or [1.0])


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
        if not (math.isfinite(raw) and raw > 1e-300):  # no round step to find (a degenerate or absurd range)
            return []
        power = 10 ** math.floor(math.log10(raw))
        step = next(power * m for m in (1, 2, 5, 10) if power * m >= raw)
        first = math.ceil(self.low / step)
        return [k * step for k in range(first, math.floor(self.high / step) + 1)]


def axes(frame: Frame) -> list[Html]:
    out = [Html('<line x1="{l}" y1="{t}" x2="{l}" y2="{b}" stroke="#999"/>').format(l=LEFT, t=TOP, b=HEIGHT - BOTTOM),
           Html('<line x1="{l}" y1="{b}" x2="{r}" y2="{b}" stroke="#999"/>').format(l=LEFT, b=HEIGHT - BOTTOM,
                                                                                   r=WIDTH - RIGHT)]
    for value in frame.ticks():
        y = frame.y(value)
        out.append(Html('<line x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#eee"/>'
                        '<text class="tick" x="{xt}" y="{yt:.1f}" text-anchor="end">{label}</text>').format(
            x0=LEFT - 4, x1=WIDTH - RIGHT, y=y, xt=LEFT - 6, yt=y + 4, label=frame.text(value)))
    for commit in frame.commits:
        out.append(Html('<text class="tick" x="{x:.1f}" y="{y}" text-anchor="middle">{commit}</text>').format(
            x=frame.x(commit), y=HEIGHT - BOTTOM + 16, commit=commit[:8]))
    # the unit above the value axis, right of it: never on the tick labels, however long they are
    out.append(Html('<text class="unit" x="{x}" y="{y}">{unit}</text>').format(x=LEFT + 4, y=TOP - 7,
                                                                                   unit=frame.unit))
    return out


def point_marks(frame: Frame, points: list[Point], color: str, machine: str, counted: str) -> list[Html]:
    out, line = [], [p for p in points if p.value is not None]
    if len(line) > 1:
        path = " ".join(f"{frame.x(p.commit):.1f},{frame.y(p.value):.1f}" for p in line)
        out.append(Html('<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>').format(
            path=path, color=color))
    for p in line:
        x, y = frame.x(p.commit), frame.y(p.value)
        tip = f"{machine} @ {p.commit[:8]}: {frame.text(p.value)} {frame.unit}"
        if p.estimate is not None:
            low, high = frame.y(p.estimate.low), frame.y(p.estimate.high)
            out.append(Html('<path d="M{a:.1f},{high:.1f}H{b:.1f}M{x:.1f},{high:.1f}V{low:.1f}M{a:.1f},{low:.1f}'
                            'H{b:.1f}" stroke="{color}" fill="none"/>').format(a=x - 4, b=x + 4, x=x, low=low,
                                                                             high=high, color=color))
            tip += f" [{frame.text(p.estimate.low)}, {frame.text(p.estimate.high)}] 95% CI, {p.samples} {counted}"
        elif p.note:
            tip += f" ({p.note})"
        out.append(Html('<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"><title>{tip}</title>'
                        '</circle>').format(x=x, y=y, color=color, tip=tip))
    return out


def step_text(step: Step) -> str:
    """The verdict with the quantity its ratio divides: "slower: speedup old/new 2.412 [...] (speedup 1.6 → 0.665)"."""
    if step.judged is None:
        return f"not judged: {step.reason}"
    j = step.judged
    moved = f" ({step.quantity.split()[0]} {step.values[0]:.4g} → {step.values[1]:.4g})" if step.values else ""
    return f"{step.verdict}: {step.quantity} {j.ratio:.3f} [{j.low:.3f}, {j.high:.3f}]{moved}, MDE ±{j.mde:.1%}"


def step_marks(frame: Frame, chart: Chart, color_for) -> list[Html]:
    out = []
    for step in chart.steps:
        points = {p.commit: p for p in chart.series[step.machine]}
        old, new = points[step.old], points[step.new]
        x = (frame.x(step.old) + frame.x(step.new)) / 2
        y = (frame.y(old.value) + frame.y(new.value)) / 2
        tip = f"{step.machine} {step.old[:8]} → {step.new[:8]}: {step_text(step)}"
        if step.verdict in STEP_COLORS:
            tip_y, base_y = (y - 8, y + 5) if step.verdict == SLOWER else (y + 8, y - 5)
            out.append(Html('<polygon class="step {verdict}" points="{a:.1f},{base:.1f} {b:.1f},{base:.1f} {x:.1f},'
                            '{tip_y:.1f}" fill="{fill}"><title>{tip}</title></polygon>').format(
                verdict=step.verdict, a=x - 6, b=x + 6, base=base_y, x=x, tip_y=tip_y,
                fill=STEP_COLORS[step.verdict], tip=tip))
        elif step.judged is None:  # not a verdict at all: a dashed grey ring, never the "within noise" circle
            out.append(Html('<circle class="step not-judged" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="white" '
                            'stroke="#999" stroke-dasharray="2 2"><title>{tip}</title></circle>').format(
                x=x, y=y, tip=tip))
        else:
            out.append(Html('<circle class="step" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="white" stroke="{color}">'
                            '<title>{tip}</title></circle>').format(x=x, y=y, color=color_for(step.machine), tip=tip))
    return out


def environment_flags(frame: Frame, marks: list[EnvironmentMark], color_for) -> list[Html]:
    out = []
    for mark in marks:
        if mark.new not in frame.commits:
            continue
        x = frame.x(mark.new) - 6
        tip = (f"{mark.machine}: environment changed {mark.old[:8]} → {mark.new[:8]}: "
               + "; ".join(f"{d.key} {d.old} → {d.new}" for d in mark.differences))
        out.append(Html('<g class="environment-mark"><line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" '
                        'stroke="{color}" stroke-dasharray="4 3"/><text x="{tx:.1f}" y="{ty}" fill="{color}">env</text>'
                        '<title>{tip}</title></g>').format(x=x, top=TOP, bottom=HEIGHT - BOTTOM, tx=x + 3, ty=TOP + 10,
                                                           color=color_for(mark.machine), tip=tip))
    return out


def chart_svg(history: History, chart: Chart) -> Html:
    frame = Frame(history, chart)
    color_for = lambda machine: color_of(history, machine)  # noqa: E731
    parts = axes(frame) + environment_flags(frame, history.marks, color_for)
    for machine, points in chart.series.items():
        parts += point_marks(frame, points, color_for(machine), machine, "rotations" if chart.higher_is_better else
                             "samples")
    parts += step_marks(frame, chart, color_for)
    return Html('<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{title}">{parts}</svg>'
                ).format(w=WIDTH, h=HEIGHT, title=chart.title, parts=Html().join(parts))


def steps_table(chart: Chart) -> Html:
    if not chart.steps:
        return Html('<p class="muted">one commit per machine: no step to judge</p>')
    rows = [Html('<tr><td>{machine}</td><td><code>{old} → {new}</code></td><td class="{css}">{verdict}</td></tr>').format(
        machine=step.machine, old=step.old[:8], new=step.new[:8],
        css=step.verdict if step.verdict in STEP_COLORS else "muted", verdict=step_text(step))
        for step in chart.steps]
    return Html("<table><tr><th>machine</th><th>step</th><th>kvbench's verdict</th></tr>{}</table>").format(
        Html().join(rows))


def legend(history: History) -> Html:
    machines = Html().join(Html('<span><i class="swatch" style="background:{color}"></i>{machine}</span>').format(
        color=color_of(history, m), machine=m) for m in history.machines)
    return Html('<p class="legend">{machines}</p><p class="muted">Points: the value with its 95% confidence interval. '
                '<span class="slower">▲</span> slower, <span class="faster">▼</span> faster: beyond the minimum '
                'detectable effect and {factor:g}x, as <code>kvbench compare</code> judges (a drop in speedup '
                'is slower); ○ within noise or unchanged; <span class="muted">◌</span> not judged (one side has no '
                'interval: a <code>time_*</code> step needs <code>asv run --record-samples</code>); dashed '
                '<i>env</i>: that machine\'s captured environment changed. Hover any mark for its numbers.</p>'
                ).format(machines=machines, factor=history.factor)


def commit_date(commit) -> str:
    if not commit.date:
        return ""
    moment = datetime.datetime.fromtimestamp(commit.date / 1000, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M")


def commits_table(history: History) -> Html:
    rows = [Html("<tr><td><code>{hash}</code></td><td>{date} UTC</td></tr>").format(hash=c.hash, date=commit_date(c))
            for c in history.commits]
    return Html("<table><tr><th>commit</th><th>date</th></tr>{}</table>").format(Html().join(rows))


def marks_table(history: History) -> Html:
    if not history.marks:
        return Html('<p class="muted">No captured environment changed between two commits of one machine.</p>')
    rows = [Html("<tr><td>{machine}</td><td><code>{old} → {new}</code></td><td>{rank}</td><td><code>{key}</code></td>"
                 "<td>{was} → {now}</td></tr>").format(machine=mark.machine, old=mark.old[:8], new=mark.new[:8],
                                                       rank=d.rank, key=d.key, was=d.old, now=d.new)
            for mark in history.marks for d in mark.differences]
    return Html("<table><tr><th>machine</th><th>commits</th><th>rank</th><th>fact</th><th>old → new</th></tr>"
                "{}</table>").format(Html().join(rows))


def chart_section(history: History, chart: Chart) -> Html:
    return Html('<section class="chart" data-title="{title}"><h2>{title}</h2>{svg}{steps}</section>').format(
        title=chart.title, svg=chart_svg(history, chart), steps=steps_table(chart))


def render_page(history: History) -> str:
    notes = Html().join(Html("<li>{}</li>").format(note) for note in history.notes)
    return str(Html("").join([
        Html('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
             '<meta http-equiv="Content-Security-Policy" content="{policy}">'
             "<title>kvbench history: {source}</title><style>{style}</style></head><body>"
             "<h1>kvbench history of <code>{source}</code></h1>"
             "<p>{charts} benchmark × parameter charts, {machines} machine(s), {commits} commit(s). Generated by "
             "<code>kvbench history</code>; this file loads nothing from anywhere.</p>").format(
            policy=Html(content_security_policy(SCRIPT)), source=history.results_dir, style=Html(STYLE.replace("\n", "")),
            charts=len(history.charts), machines=len(history.machines), commits=len(history.commits)),
        legend(history), Html("<h2>Commits</h2>"), commits_table(history),
        Html("<h2>Environment changes</h2>"), marks_table(history),
        Html('<ul class="muted">{}</ul>').format(notes) if history.notes else Html(),
        Html('<p><label>Filter charts: <input id="filter" type="search" placeholder="e.g. static"></label></p>'),
        *(chart_section(history, chart) for chart in history.charts),
        Html("<script>{}</script></body></html>\n").format(Html(SCRIPT)),
    ]))
