"""What every panel's axes share: time ticks in the unit each reads in, and legends placed where they cover no data.

A log time axis spans decades, so one unit for the whole axis writes either "10000 ms" or "0.001 s"; each tick
names its own unit instead ("1 ms", "10 ms", "1 s"). matplotlib's "best" legend location minimises overlap with
what it counts as data, which misses error bars and the lines between markers; kvbench.report.record.plots places
every legend through `place_legend`, which counts them, checked after layout.
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.legend import Legend
from matplotlib.ticker import Formatter
from matplotlib.transforms import Bbox

from kvbench.report.format import seconds_unit

ALL_MINOR_DECADES, SOME_MINOR_DECADES = 0.4, 1.5  # an axis this short labels every minor tick, or the 2s and 5s


def duration_text(seconds: float) -> str:
    """One tick's time in the unit it reads in (kvbench.report.format.seconds_unit): "2 ms", "10 s", "500 µs"."""
    scale, unit = seconds_unit([seconds])
    return f"{seconds * scale:g} {unit}"


class DurationTicks(Formatter):
    """A log axis of seconds labelled in scaled units: every decade, and its 2s and 5s (or all) when it is short."""

    def __call__(self, value: float, pos=None) -> str:
        if value <= 0:
            return ""
        value = float(f"{value:.12g}")  # a decade computed as 0.000999…: its tick is 1 ms
        low, high = sorted(self.axis.get_view_interval()) if self.axis is not None else (value, value)
        decades = math.log10(high / low) if low > 0 else math.inf
        mantissa = f"{value:.1e}"[:3]  # "2.0" for 0.002; ticks between the whole ones are not labelled
        if mantissa[1:] != ".0":
            return ""
        if mantissa[0] == "1" or decades < ALL_MINOR_DECADES or (decades < SOME_MINOR_DECADES and mantissa[0] in "25"):
            return duration_text(value)
        return ""


def duration_ticks(axis) -> None:
    """A log axis of seconds, its ticks in scaled units."""
    axis.set_major_formatter(DurationTicks())
    axis.set_minor_formatter(DurationTicks())


def data_points(ax: Axes) -> list[tuple[float, float]]:
    """Display coordinates of what the axes show as data: every marker, every line with a point every few
    pixels along it, every error bar. Reference lines across the axes (axhline, axvline) are not data, nor
    are the translucent interval bands."""
    drawn = [(line.get_transform().transform_path(line.get_path()), line.get_linestyle() not in ("None", "", " "))
             for line in ax.get_lines() if line.get_transform() == ax.transData]
    drawn += [(c.get_transform().transform_path(path), True) for c in ax.collections
              if isinstance(c, LineCollection) and c.get_transform() == ax.transData for path in c.get_paths()]
    points = []
    for path, joined in drawn:
        vertices = [tuple(v) for v in path.vertices if all(abs(c) < 1e9 for c in v)]  # log of 0: not drawn
        points += vertices
        for (x0, y0), (x1, y1) in zip(vertices, vertices[1:]) if joined else ():
            steps = max(1, int(max(abs(x1 - x0), abs(y1 - y0)) / 3))
            points += [(x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps) for i in range(1, steps)]
    return points


def covered_points(ax: Axes, legend: Legend) -> int:
    """How many data points lie under the legend box, after layout."""
    ax.figure.draw_without_rendering()
    box: Bbox = legend.get_window_extent()
    return sum(box.contains(x, y) for x, y in data_points(ax))


def place_legend(ax: Axes, **options) -> Legend:
    """matplotlib's "best" spot inside the axes when it covers no data, else outside, to the right of the axes."""
    legend = ax.legend(loc="best", **options)
    if covered_points(ax, legend):
        legend.remove()
        legend = ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **options)
    return legend
