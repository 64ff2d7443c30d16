"""kvbench.report.record.plots from the figure objects: intervals drawn where the tables have them, legends clear of
the data, captions naming the interval the record used."""

import re

import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from records import LIMITS, request_record, scaling_seconds, synthetic_record, view

from kvbench.report.record import html, plots
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
    for container in ax.containers:
        rows = report.rows_of(container.get_label())
        assert bar_ends(container) == [pytest.approx((r.q1 / r.length * 1e6, r.q3 / r.length * 1e6)) for r in rows]


def test_a_requests_step_latency_has_its_interquartile_band_over_requests():
    report = request_report()
    ax = plots.panel_figure(report, "context").axes[0]
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == len(report.step_latency) == 3
    for band, steps in zip(bands, report.step_latency.values()):
        low, high = band.get_paths()[0].get_extents().y0, band.get_paths()[0].get_extents().y1
        assert low == pytest.approx(min(q1 for q1, _, _ in steps) * 1e3)
        assert high == pytest.approx(max(q3 for _, _, q3 in steps) * 1e3)
        assert all(q1 <= median <= q3 for q1, median, q3 in steps)
    assert "interquartile range over requests" in ax.get_legend().get_title().get_text()


def drawn_data(ax) -> list:
    """Display-space paths of the data, told apart from the reference lines, independently of plots.data_points:
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
    assert legend_overlaps(ax) and plots.covered_points(ax, inside) > 0  # both checks see it
    plots.place_legend(ax)
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
