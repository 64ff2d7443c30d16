"""kvbench.report.record.plots from the figure objects: intervals drawn where the tables have them, legends clear of
the data, captions naming the interval the record used."""

import re
from pathlib import Path

import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from records import LIMITS, request_record, scaling_seconds, synthetic_record, view

from kvbench.record import RecordView
from kvbench.report.format import plain, seconds_unit
from kvbench.report.record import html, plots
from kvbench.report.record.axes import DurationTicks, covered_points, place_legend
from kvbench.report.record.model import build_report


def loop_report(lengths=(16, 32, 64, 128)):
    record = synthetic_record(scaling_seconds(modes=("full", "concat", "static"), lengths=lengths),
                              per_step=[{"mode": "full", "length": 40, "seconds": [1e-4 + 1e-5 * t for t in range(40)]},
                                        {"mode": "concat", "length": 40, "seconds": [1.55e-4] * 40}])
    return build_report(view(record))


def contexts_report():
    return build_report(view(synthetic_record(scaling_seconds(modes=("full", "static", "paged"), lengths=(64, 256)),
                                              workload={"kind": "contexts"}, limits=LIMITS)))


def request_report():
    record = request_record()
    record["limits"] = LIMITS
    return build_report(view(record))


REPORTS = {"loop": loop_report, "one length": lambda: loop_report((64,)), "contexts": contexts_report,
           "request": request_report}


def bar_ends(container: ErrorbarContainer) -> list[tuple[float, float]]:
    """(low, high) in data coordinates of each vertical error bar."""
    (bars,) = container.lines[2]
    return [(min(segment[:, 1]), max(segment[:, 1])) for segment in bars.get_segments()]


def test_a_single_speedup_point_has_its_interval_as_a_bar_and_the_legend_names_it():
    report = loop_report((64,))
    ax = plots.panel_figure(report, "speedup").axes[0]
    containers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [c.get_label() for c in containers] == ["concat", "static"]
    for container, mode in zip(containers, ("concat", "static")):
        (row,) = report.rows_of(mode)
        assert container.has_yerr and bar_ends(container) == [pytest.approx((row.speedup.low, row.speedup.high))]
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "bars: 95% rerun interval"
    assert not any("band" in text.get_text() for text in legend.get_texts())
    assert not any(isinstance(c, PolyCollection) for c in ax.collections)  # no band around a single point


def test_speedups_over_several_lengths_have_bars_and_a_band_between_them():
    report = loop_report()
    ax = plots.panel_figure(report, "speedup").axes[0]
    (concat,) = [c for c in ax.containers if c.get_label() == "concat"]
    rows = report.rows_of("concat")
    assert bar_ends(concat) == [pytest.approx((r.speedup.low, r.speedup.high)) for r in rows]
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 2  # one band per cached mode


def test_per_token_bars_are_the_interquartile_range_per_token():
    report = loop_report()
    ax = plots.panel_figure(report, "per_token").axes[0]
    assert ax.get_legend().get_title().get_text() == "bars: interquartile range"
    scale, unit = seconds_unit([r.unit_seconds for r in report.rows])
    assert ax.get_ylabel() == f"median time per token, wall time ({unit})"
    for container in ax.containers:
        rows = report.rows_of(container.get_label())
        assert bar_ends(container) == [pytest.approx((r.q1 / r.length * scale, r.q3 / r.length * scale)) for r in rows]


def test_a_requests_step_latency_has_its_interquartile_band_over_requests():
    report = request_report()
    ax = plots.panel_figure(report, "context").axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(report.step_latency) == 3
    for band, steps in zip(bands, report.step_latency.values()):
        low, high = band.get_paths()[0].get_extents().y0, band.get_paths()[0].get_extents().y1
        assert low == pytest.approx(min(q1 for q1, _, _ in steps))  # seconds, its ticks in scaled units
        assert high == pytest.approx(max(q3 for _, _, q3 in steps))
        assert all(q1 <= median <= q3 for q1, median, q3 in steps)
    assert "interquartile range over requests" in ax.get_legend().get_title().get_text()


def drawn_data(ax) -> list:
    """Display-space paths of the data, told apart from the reference lines, independently of kvbench.report.record.axes.data_points:
    (path, joined) for every line on data coordinates and every error bar."""
    out = [(line.get_transform().transform_path(line.get_path()), line.get_linestyle() not in ("None", " ", ""))
           for line in ax.get_lines() if line.get_transform() == ax.transData and len(line.get_xydata())]
    out += [(c.get_transform().transform_path(p), True) for c in ax.collections if isinstance(c, LineCollection)
            for p in c.get_paths()]
    return out


def legend_overlaps(ax) -> list[str]:
    legend = ax.get_legend()
    ax.figure.draw_without_rendering()
    box = legend.get_window_extent()
    hits = []
    for path, joined in drawn_data(ax):
        if box.count_contains(path.vertices) or (joined and path.intersects_bbox(box, filled=False)):
            hits.append(f"{path.vertices[:3].tolist()}...")
    return hits


@pytest.mark.parametrize("kind", REPORTS)
def test_no_legend_covers_data(kind):
    report = REPORTS[kind]()
    for name in plots.drawn_panels(report):
        if name == "per_step" and report.profile is None:
            continue
        ax = plots.panel_figure(report, name).axes[0]
        if ax.get_legend() is not None:
            assert legend_overlaps(ax) == [], (kind, name)


def test_the_check_sees_a_legend_on_the_data_and_moves_it_outside():
    figure = Figure(figsize=(6.4, 4.4), layout="constrained")
    ax = figure.subplots()
    xs = [i / 50 for i in range(51)]
    for k in range(12):  # lines through every part of the axes: no spot inside is free
        ax.plot(xs, [(x * (k + 1) * 7.3) % 1 for x in xs], lw=1, label=f"line {k}")
    inside = ax.legend(loc="upper left")
    assert legend_overlaps(ax) and covered_points(ax, inside) > 0  # both checks see it
    place_legend(ax)
    assert legend_overlaps(ax) == []
    assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1  # outside, on the right


def test_captions_name_the_interval_the_record_used():
    report = loop_report()
    assert report.interval == "rerun"
    assert "95% rerun interval" in plots.caption("speedup", report)
    page = html.render_report(report, plots.render_panels(report))
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", page)
    assert len(captions) == len(plots.render_panels(report)) and all(captions)
    assert not any("bootstrap" in text for text in captions)
    report.interval = "percentile bootstrap"  # a schema-1 record: its interval was a bootstrap, and is named so
    assert "95% percentile bootstrap interval" in plots.caption("speedup", report)


# -- every plot on the clock of the table it illustrates ----------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
REAL = "results/real/quality-quantized.json"  # a real model's run: its one length's speedups on CPU time
MIXED = "results/contention/memory/run-00.json"  # lengths 16-256 on wall time, 512 on CPU time
CONTEXTS = "results/real/contexts-hf.json"  # a real model's steps at two contexts, 16 timed steps a sample
LONG = "results/llama/llama-tiny.json"  # loops from about 1 ms to 10 s: the time axis spans four decades


def committed(name: str):
    return build_report(RecordView.load(ROOT / name))


def medians_drawn(ax) -> dict[str, list[float]]:
    """Each error-bar series' medians as drawn (its data line), by its label."""
    return {c.get_label().split()[0]: list(c.lines[0].get_ydata()) for c in ax.containers
            if isinstance(c, ErrorbarContainer)}


def test_a_cpu_time_records_plots_draw_cpu_time_as_its_tables_do():
    report = committed(REAL)
    assert report.clocks() == ["cpu"]
    time = plots.panel_figure(report, "time").axes[0]
    assert time.get_ylabel() == "median time per loop, CPU time"
    for mode, drawn in medians_drawn(time).items():
        assert drawn == [pytest.approx(r.timed.median) for r in report.rows_of(mode)]
        assert drawn != [pytest.approx(r.median) for r in report.rows_of(mode)]  # wall time carried the waits
    per_token = plots.panel_figure(report, "per_token").axes[0]
    scale, unit = seconds_unit([r.unit_seconds for r in report.rows])
    assert per_token.get_ylabel() == f"median time per token, CPU time ({unit})"
    for mode, drawn in medians_drawn(per_token).items():
        assert drawn == [pytest.approx(r.unit_seconds * scale) for r in report.rows_of(mode)]
    assert plots.caption("time", report).endswith("interquartile range.")  # one length: no fit to speak of


def test_a_fit_on_wall_time_is_not_drawn_through_cpu_time_points():
    report = committed(MIXED)
    assert any(report.fits.values())
    ax = plots.panel_figure(report, "time").axes[0]
    assert not any(line.get_linestyle() == "--" for line in ax.get_lines())
    assert "no fitted line: the fit is on wall time" in plots.caption("time", report)
    wall = loop_report()
    assert sum(line.get_linestyle() == "--" for line in plots.panel_figure(wall, "time").axes[0].get_lines()) == 3
    assert "dashed lines the fitted a·T^b" in plots.caption("time", wall)


def test_a_record_with_two_clocks_draws_its_cpu_time_points_open():
    report = committed(MIXED)
    assert report.clocks() == ["wall", "cpu"]
    ax = plots.panel_figure(report, "time").axes[0]
    assert ax.get_ylabel() == "median time per loop, wall time; open: CPU time"
    opened = [line for line in ax.get_lines() if line.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))]
    assert len(opened) == len(report.modes)
    for line in opened:
        assert list(line.get_xdata()) == [512]
    for mode, drawn in medians_drawn(ax).items():
        assert drawn == [pytest.approx(r.timed.median) for r in report.rows_of(mode)]


def test_a_contexts_step_latency_is_the_timing_tables_per_step_figure():
    report = committed(CONTEXTS)
    ax = plots.panel_figure(report, "context").axes[0]
    assert ax.get_ylabel() == "step latency, wall time"
    for mode, drawn in medians_drawn(ax).items():
        rows = report.rows_of(mode)
        assert drawn == [pytest.approx(r.unit_seconds) for r in rows]  # one step's, not a sample's 16 steps
        assert drawn == [pytest.approx(r.median / 16) for r in rows]


def test_the_trade_off_plot_labels_its_time_on_the_tables_clock():
    report = build_report(view(synthetic_record(scaling_seconds(modes=("full", "quantized-int8"), lengths=(16, 32)))))
    ax = plots.panel_figure(report, "tradeoff").axes[0]
    (entry,) = [e for e in report.tradeoffs if e.length == 32]
    scale, unit = seconds_unit([entry.unit_seconds])
    label = f"T=32: {plain(entry.unit_seconds * scale)} {unit}/token, wall time"
    assert [text.get_text() for text in ax.texts] == [label]


def test_time_ticks_name_their_unit_and_never_write_thousands_of_one():
    report = committed(LONG)
    ax = plots.panel_figure(report, "time").axes[0]
    ax.figure.draw_without_rendering()
    labels = [t.get_text() for t in ax.get_yticklabels() + ax.yaxis.get_minorticklabels() if t.get_text()]
    assert {"1 ms", "1 s", "10 s"} <= set(labels)
    for label in labels:
        number, unit = label.split(" ")
        assert unit in ("s", "ms", "µs") and 1 <= float(number) < 1000, label


@pytest.mark.parametrize("seconds, text", [(1e-3, "1 ms"), (0.0009999999999999998, "1 ms"), (10.0, "10 s"),
                                           (2e-5, "20 µs"), (0.2, "200 ms"), (1.0, "1 s"),
                                           (0.25, "")])  # between the whole ticks: unlabelled
def test_a_duration_tick_reads_in_its_own_unit(seconds, text):
    assert DurationTicks()(seconds) == text
