"""Plots of a report with matplotlib's Agg canvas: no pyplot, no global state, no display.

Each panel is a function drawing onto one Axes, so the overview figure
(`kvbench report --plot`) and the single figures embedded in the HTML report
are the same drawing. Every median carries the interval its table shows (the
interquartile range of the seconds, the speedup's interval named as the record
names it), and every legend is placed where it covers no data, checked after
layout (kvbench.report.record.axes). Every time is on the clock of the table it illustrates, named on its
axis, in a unit its values read in (s, ms, µs). Output bytes are deterministic for a given report and matplotlib
version (no dates in the metadata, a fixed SVG hash salt).
"""

from __future__ import annotations

import io

from matplotlib import rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from kvbench.report.format import plain, seconds_unit
from kvbench.report.record.axes import duration_ticks, place_legend
from kvbench.report.record.heatmap import needle_figure
from kvbench.report.record.model import Report, Row

PLOT_FORMATS = {".png": "image/png", ".svg": "image/svg+xml"}
DPI = 110
COLORS = {"full": "#222222", "concat": "#1f77b4", "static": "#ff7f0e", "paged": "#2ca02c",
          "quantized-int8": "#9467bd", "quantized-int4": "#8c564b", "window": "#e377c2"}
EXTRA_COLORS = ("#17becf", "#bcbd22", "#7f7f7f", "#d62728")
FAILED_COLOR = "#d62728"
RC = {"svg.hashsalt": "kvbench", "font.size": 9.5, "axes.titlesize": 10.5, "axes.grid": True,
      "grid.alpha": 0.3, "legend.fontsize": 8.5, "legend.frameon": False}


def color(mode: str, modes: list[str]) -> str:
    if mode in COLORS:
        return COLORS[mode]
    others = [m for m in modes if m not in COLORS]
    return EXTRA_COLORS[others.index(mode) % len(EXTRA_COLORS)]


AXIS_LABELS = {"loop": "length T (tokens decoded)", "contexts": "context c (tokens prefilled before the step)",
               "request": "context (tokens held before the step)"}


def _length_axis(ax: Axes, lengths: list[int], workload: str = "loop") -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(AXIS_LABELS.get(workload, AXIS_LABELS["loop"]))


def _plain_numbers(axis) -> None:
    """Log-scale labels written as plain numbers (0.3, 2, 40), minor ones included."""
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}" if f"{value:.1g}"[0] in "25" else ""))


def _lengths(report: Report) -> list[int]:
    return sorted({row.length for row in report.rows})


CLOCK_WORDS = {"wall": "wall time", "cpu": "CPU time"}


def clock_words(report: Report) -> str:
    """The clock of a panel's times, as its axis names it: the timing table's, one per table. When lengths differ
    in clock (each table has one), the points on another clock than wall time are drawn open."""
    clocks = report.clocks() or ["wall"]
    if len(clocks) == 1:
        return CLOCK_WORDS.get(clocks[0], clocks[0])
    return "wall time; open: " + ", ".join(CLOCK_WORDS.get(c, c) for c in clocks if c != "wall")


def timed(rows: list[Row], per_unit: bool = False) -> tuple[list[float], list[list[float]]]:
    """The medians the timing table shows, on each row's clock, in seconds (`per_unit`: per token of a loop, per
    step at a context, as its µs/token or ms/step column), and their interquartile bars below and above."""
    per = [(r.per_sample or r.length) if per_unit else 1 for r in rows]
    medians = [r.timed.median / n for r, n in zip(rows, per)]
    bars = [[(r.timed.median - r.timed.q1) / n for r, n in zip(rows, per)],
            [(r.timed.q3 - r.timed.median) / n for r, n in zip(rows, per)]]
    return medians, bars


def open_markers(ax: Axes, report: Report, rows: list[Row], values: list[float], shade: str) -> None:
    """When the run's lengths have several clocks, its points on another clock than wall time drawn open."""
    if len(report.clocks()) < 2:
        return
    other = [(r.length, v) for r, v in zip(rows, values) if r.clock != "wall"]
    if other:
        ax.plot([x for x, _ in other], [y for _, y in other], "o", ms=6, mfc="white", mec=shade, mew=1.4)


def panel_time(ax: Axes, report: Report) -> None:
    """Median loop time per mode on the timing table's clock, log-log, IQR bars; the fitted power law (on wall
    time, as its table) only when the times are wall time too."""
    modes, fitted = report.modes, report.clocks() == ["wall"]
    for mode in modes:
        rows = report.rows_of(mode)
        x = [r.length for r in rows]
        y, bars = timed(rows)
        fit = report.fits.get(mode) if fitted else None
        label = mode
        if fit is not None:
            label += f"  b = {fit.b:.2f}" + (f" ± {fit.b_stderr:.2f}" if fit.b_stderr is not None else "")
        ax.errorbar(x, y, yerr=bars, marker="o", ms=4, lw=1.4, capsize=2.5, color=color(mode, modes), label=label)
        open_markers(ax, report, rows, y, color(mode, modes))
        if fit is not None and len(x) >= 2:
            xs = [min(x) * (max(x) / min(x)) ** (i / 40) for i in range(41)]
            ax.plot(xs, [fit.predict(v) for v in xs], ls="--", lw=0.9, color=color(mode, modes), alpha=0.7)
        failed = [(r.length, v) for r, v in zip(rows, y) if "failed" in r.marks]
        if failed:
            ax.plot([x for x, _ in failed], [v for _, v in failed], "x", ms=9, mew=2,
                    color=FAILED_COLOR, label=f"{mode}: equivalence failed")
    _length_axis(ax, _lengths(report))
    ax.set_yscale("log")
    duration_ticks(ax.yaxis)
    ax.set_ylabel(f"median time per loop, {clock_words(report)}")
    ax.set_title("Time vs length (log-log)" + (", dashed: a·T^b fit" if fitted else ""))
    place_legend(ax, title="bars: interquartile range")


def panel_speedup(ax: Axes, report: Report) -> None:
    """Speedup over the baseline with the record's interval: a bar at every point, a band between points."""
    modes = report.modes
    drawn = False
    for mode in modes:
        rows = [r for r in report.rows_of(mode) if r.speedup is not None]
        if not rows:
            continue
        drawn = True
        x, y = [r.length for r in rows], [r.speedup.ratio for r in rows]
        c = color(mode, modes)
        if len(rows) > 1:
            ax.fill_between(x, [r.speedup.low for r in rows], [r.speedup.high for r in rows], color=c, alpha=0.18,
                            lw=0)
        ax.errorbar(x, y, yerr=[[r.speedup.ratio - r.speedup.low for r in rows],
                                [r.speedup.high - r.speedup.ratio for r in rows]],
                    marker="o", ms=4, lw=1.4, capsize=3, color=c, label=mode)
        invalid = [r for r in rows if not r.speedup_valid]
        if invalid:
            ax.plot([r.length for r in invalid], [r.speedup.ratio for r in invalid], "x", ms=9, mew=2,
                    color=FAILED_COLOR, label=f"{mode}: invalid (equivalence failed)")
    ax.axhline(1.0, color="#555555", lw=0.9, ls=":")
    _length_axis(ax, _lengths(report), report.workload["kind"])
    ax.set_ylabel(f"speedup over {report.baseline} (×)")
    ax.set_title(f"Speedup vs {'context' if report.workload['kind'] == 'contexts' else 'length'} "
                 f"({report.baseline} / cached)")
    if drawn:
        place_legend(ax, title=f"bars: {report.interval_name}")
    else:
        ax.text(0.5, 0.5, f"no {report.baseline!r} baseline: no speedups", transform=ax.transAxes, ha="center")


def panel_per_token(ax: Axes, report: Report) -> None:
    """The timing table's µs/token column: each mode's median per token on its clock, IQR bars."""
    modes = report.modes
    scale, unit = seconds_unit([r.unit_seconds for r in report.rows])
    for mode in modes:
        rows = report.rows_of(mode)
        medians, bars = timed(rows, per_unit=True)
        y = [v * scale for v in medians]
        ax.errorbar([r.length for r in rows], y, yerr=[[v * scale for v in side] for side in bars],
                    marker="o", ms=4, lw=1.4, capsize=2.5, color=color(mode, modes), label=mode)
        open_markers(ax, report, rows, y, color(mode, modes))
    _length_axis(ax, _lengths(report))
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"median time per token, {clock_words(report)} ({unit})")
    ax.set_title("Per-token cost vs length")
    place_legend(ax, title="bars: interquartile range")


def panel_per_step(ax: Axes, report: Report) -> None:
    profile = report.profile
    if profile is None:
        ax.set_axis_off()
        ax.text(0.5, 0.5, "no per-step profile in this record\n(kvbench run --per-step LENGTH)",
                transform=ax.transAxes, ha="center", va="center", color="#555555")
        return
    modes = list(profile.seconds)
    for mode in modes:
        c = color(mode, modes)
        steps = range(len(profile.seconds[mode]))
        ax.plot(steps, profile.seconds[mode], ".", ms=2.5, color=c, alpha=0.3)
        ax.plot(steps, profile.smoothed[mode], lw=1.6, color=c, label=f"{mode} (running median)")
    for mode, step in profile.crossovers.items():
        if step is not None:  # labelled in the legend: text on the axes would collide at equal steps
            ax.axvline(step, color=color(mode, modes), ls=":", lw=1.4, label=f"{mode} pays from step {step}")
    ax.set_yscale("log")
    duration_ticks(ax.yaxis)
    ax.set_xlabel("decode step (position)")
    ax.set_ylabel("step duration, wall time")  # each step's own timer reads wall time
    ax.set_title(f"Per-step latency, one loop at length {profile.length}")
    place_legend(ax, frameon=True, framealpha=0.9, edgecolor="#dddddd")


def quality_points(report: Report) -> list:
    """The quality rows the trade-off plots, when the record has quality on text: every mode but the baseline's
    (the one without a difference from itself)."""
    return [row for row in report.quality if row.nll_difference is not None]


def panel_tradeoff(ax: Axes, report: Report) -> None:
    """Bytes kept (of the float formula) against drift (mean KL): with quality on text, each kind's KL on the text
    at the chunk's length (the timed lengths may sit inside a quantized kind's float residual, where the gate's
    KL is float rounding); else one line per kind over the timed lengths, the gate's KL."""
    if quality_points(report):
        return panel_quality_tradeoff(ax, report)
    modes = report.modes
    floor = 1e-12  # exact kinds have no drift: drawn on the floor of the log axis
    for mode in dict.fromkeys(entry.mode for entry in report.tradeoffs):
        entries = [entry for entry in report.tradeoffs if entry.mode == mode]
        x = [entry.bytes_ratio for entry in entries]
        y = [max((entry.check or {}).get("kl_mean", 0.0), floor) for entry in entries]
        ax.plot(x, y, marker="o", ms=4, lw=1.2, color=color(mode, modes), label=mode)
        last = entries[-1]
        scale, unit = seconds_unit([last.unit_seconds])
        per = "step" if report.kind == "contexts" else "token"
        ax.annotate(f"T={last.length}: {plain(last.unit_seconds * scale)} {unit}/{per}, "
                    f"{CLOCK_WORDS.get(last.clock, last.clock)}", (x[-1], y[-1]), fontsize=7.5,
                    xytext=(4, 4), textcoords="offset points", color=color(mode, modes))
    ax.set_yscale("log")
    ax.set_xlabel("KV bytes kept, of the float cache")
    ax.set_ylabel("mean KL(full || kind), nats, gate's (exact: floor)")
    ax.set_title("Bytes saved against drift on the timed ids")
    place_legend(ax)


def panel_quality_tradeoff(ax: Axes, report: Report) -> None:
    """One point per kind: its bytes after a chunk of text (of the float formula's) against its mean KL on it."""
    rows, modes = quality_points(report), report.modes
    floor = 1e-12  # an exact kind's KL is rounding, at most: drawn on the floor of the log axis
    labels = [row.label for row in rows]
    unknown = [row.label for row in rows if row.bytes_ratio is None]
    for row in rows:
        if row.bytes_ratio is None:
            continue
        shade = color(row.mode, modes) if row.label == row.mode else EXTRA_COLORS[labels.index(row.label) % 4]
        ax.plot([row.bytes_ratio], [max(row.kl, floor)], marker="o", ms=5, ls="none", color=shade, label=row.label)
    held = rows[0].held
    ax.set_yscale("log")
    ax.set_xlabel(f"KV bytes kept after {held} tokens, of the float cache")
    ax.set_ylabel("mean KL(full || kind) on text, nats (exact: floor)")
    ax.set_title(f"Bytes saved against drift on text ({held}-token chunks)")
    if unknown:  # said on the plot, not dropped silently
        ax.text(0.02, 0.02, "no bytes recorded: " + ", ".join(unknown), transform=ax.transAxes, fontsize=7.5,
                color="#555555")
    place_legend(ax)


def panel_context(ax: Axes, report: Report) -> None:
    """Latency of one decode step against the context it follows: a contexts run's median step per mode on the
    clock of its timing table (its ms/step column), or a request's median step at each position over its requests
    (wall time, as its latency table); both with their interquartile range."""
    modes = report.modes
    if report.step_latency:
        first = report.latency[0]
        for mode, steps in report.step_latency.items():
            contexts = [first.prompt + j for j in range(1, len(steps) + 1)]
            q1, median, q3 = ([step[k] for step in steps] for k in range(3))
            ax.fill_between(contexts, q1, q3, color=color(mode, modes), alpha=0.2, lw=0)
            ax.plot(contexts, median, lw=1.3, color=color(mode, modes), label=mode)
        ax.set_xlabel(AXIS_LABELS["request"])
        ax.set_title(f"Step latency across one request ({first.prompt} prompt tokens, median over requests)")
        legend_title, clock = "band: interquartile range over requests", "wall time"
    else:
        for mode in modes:
            rows = report.rows_of(mode)
            y, bars = timed(rows, per_unit=True)
            ax.errorbar([r.length for r in rows], y, yerr=bars, marker="o", ms=4, lw=1.4, capsize=2.5,
                        color=color(mode, modes), label=mode)
            open_markers(ax, report, rows, y, color(mode, modes))
        _length_axis(ax, _lengths(report), "contexts")
        ax.set_title("Latency of one decode step vs context")
        legend_title, clock = "bars: interquartile range", clock_words(report)
    ax.set_yscale("log")
    duration_ticks(ax.yaxis)
    ax.set_ylabel(f"step latency, {clock}")
    place_legend(ax, title=legend_title)


def panel_roofline(ax: Axes, report: Report) -> None:
    """Each step and prefill at its arithmetic intensity and achieved FLOP/s, under the measured roofs."""
    modes = report.modes
    rows = report.limits
    intensity = [row.flops / row.bytes_read for row in rows]
    low, high = min(intensity) / 4, max(intensity) * 4
    xs = [low * (high / low) ** (i / 60) for i in range(61)]
    bandwidth, compute = rows[0].bandwidth, rows[0].compute
    if bandwidth:
        roof = [bandwidth * x if compute is None else min(bandwidth * x, compute) for x in xs]
        ax.plot(xs, [r / 1e9 for r in roof], color="#555555", lw=1.2, label=f"roof: {bandwidth / 1e9:.1f} GB/s triad"
                + (f", {compute / 1e9:.0f} GFLOP/s matmul" if compute else ""))
    for row, x in zip(rows, intensity):
        marker = "s" if row.what.startswith("prefill") else "o"
        ax.plot([x], [row.achieved_flops / 1e9], marker, ms=6, color=color(row.mode, modes))
    for mode in dict.fromkeys(row.mode for row in rows):
        ax.plot([], [], "o", color=color(mode, modes), label=mode)
    ax.plot([], [], "s", color="#777777", label="prefill (o: decode step)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_numbers(ax.xaxis)
    _plain_numbers(ax.yaxis)
    ax.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title("Against the machine's limits (roofline)")
    place_legend(ax)


PANELS = {"time": panel_time, "speedup": panel_speedup, "per_token": panel_per_token, "per_step": panel_per_step,
          "tradeoff": panel_tradeoff, "context": panel_context, "roofline": panel_roofline}
WORKLOAD_PANELS = {"loop": ("time", "speedup", "per_token", "per_step", "tradeoff"),
                   "contexts": ("context", "speedup", "roofline", "tradeoff"), "request": ("context", "roofline")}


def _save(figure: Figure, suffix: str) -> bytes:
    if suffix not in PLOT_FORMATS:
        raise ValueError(f"plot format must be one of {', '.join(PLOT_FORMATS)}, got {suffix!r}")
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    metadata = {"Date": None} if suffix == ".svg" else {"Software": None}
    figure.savefig(buffer, format=suffix[1:], metadata=metadata, dpi=DPI)
    return buffer.getvalue()


def drawn_panels(report: Report) -> dict:
    """The panels this report's workload has: the trade-off only when a kind changes the representation,
    the roofline only with the machine's limits measured."""
    names = WORKLOAD_PANELS.get(report.workload["kind"], WORKLOAD_PANELS["loop"])
    return {name: PANELS[name] for name in names
            if (name != "tradeoff" or report.tradeoffs) and (name != "roofline" or report.limits)}


def render_overview(report: Report, suffix: str = ".png") -> bytes:
    """The panels on one figure (2 x 2, or 3 x 2 with the trade-off), as PNG or SVG bytes."""
    panels = drawn_panels(report)
    rows = (len(panels) + 1) // 2
    with rc_context(RC):
        figure = Figure(figsize=(12, 4.5 * rows), layout="constrained")
        title = report.title + ("" if report.complete else "  —  INCOMPLETE (interrupted run)")
        figure.suptitle(title, fontsize=12, color="#000000" if report.complete else "#a05a00")
        axes = list(figure.subplots(rows, 2).flat)
        for ax, draw in zip(axes, panels.values()):
            draw(ax, report)
        for ax in axes[len(panels):]:  # an odd panel count leaves one empty
            ax.set_axis_off()
        return _save(figure, suffix)


def panel_figure(report: Report, name: str) -> Figure:
    """One panel on a figure of its own, laid out: what the HTML report embeds."""
    with rc_context(RC):
        figure = Figure(figsize=(6.4, 4.4), layout="constrained")
        FigureCanvasAgg(figure)
        PANELS[name](figure.subplots(), report)
        return figure


def render_panels(report: Report, suffix: str = ".png") -> dict[str, tuple[bytes, str]]:
    """Each panel on its own figure: name -> (bytes, MIME type), for embedding in HTML."""
    out = {}
    for name in drawn_panels(report):
        if name == "per_step" and report.profile is None:
            continue
        with rc_context(RC):
            out[name] = (_save(panel_figure(report, name), suffix), PLOT_FORMATS[suffix])
    if report.needle is not None:  # not a panel of the overview: one grid per mode, as many as the run had
        with rc_context({**RC, "axes.grid": False}):
            out["needle"] = (_save(needle_figure(report.needle), suffix), PLOT_FORMATS[suffix])
    return out


def caption(name: str, report: Report) -> str:
    """What a panel shows, its intervals named as the record names them."""
    interval = report.interval_name
    captions = {
        "time": "Total time of one decode loop against length, log-log, on the timing table's clock; bars are the "
                "interquartile range" + ("." if not any(report.fits.values()) else
                                         ", dashed lines the fitted a·T^b." if report.clocks() == ["wall"] else
                                         "; no fitted line: the fit is on wall time, these times are not."),
        "speedup": f"Speedup of each cached mode over {report.baseline}; the bars (and the band between lengths) "
                   f"are the {interval}. Above 1 the cache pays.",
        "per_token": "Cost per generated token on the timing table's clock, bars the interquartile range: flat "
                     "means linear total cost; rising means the prefix still costs.",
        "per_step": "Duration of every step of one loop (points) and its running median (lines); the dotted line "
                    "marks where caching starts to pay.",
        "tradeoff": ("Bytes kept after a chunk of text against the mean KL on that text (the record's quality "
                     "figures), per kind. Lower left is better: fewer bytes, less drift." if quality_points(report) else
                     "Bytes kept against drift from the full prefix on the timed ids (the gate's KL), per kind and "
                     "length; the label is the time per token. Lower left is better: fewer bytes, less drift."),
        "context": "Latency of one decode step against the context before it: the median with its interquartile "
                   "range (over requests for a request run).",
        "roofline": "Each decode step and prefill at its arithmetic intensity and achieved FLOP/s, under the "
                    "machine's measured bandwidth and compute roofs.",
        "needle": "Retrieval of the needle per mode: depth down, context across, the colour the answer's "
                  "log-probability (one scale for every mode), ✓ where the greedy answer was the code.",
    }
    return captions.get(name, "")
