"""The needle's heat maps (kvbench.workloads.needle): one panel per mode, depth down and context across, the colour
the answer's log-probability on one scale for every mode (so a panel paler than full's lost the needle there),
each cell labelled with its value and whether the greedy answer was right. Drawn on matplotlib's Agg canvas like
kvbench.report.record.plots, which embeds it in the HTML report; it and kvbench.report.record.axes (the plots' axes)
are the only other modules that import matplotlib."""

from __future__ import annotations

import math

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from kvbench.report.record.needle import Needle

COLUMNS = 3  # panels a row
CMAP = "viridis"  # perceptually uniform, readable in grey
MISSED = "✗"  # the greedy answer was not the code
FOUND = "✓"


def needle_figure(needle: Needle) -> Figure:
    """Every mode's grid on one figure, one colour bar: log-prob in nats, brighter is more likely."""
    values = [value for row in needle.rows for value, _ in row.grid.values()]
    low, high = min(values), max(values)
    if math.isclose(low, high):
        low, high = low - 1, high + 1  # one value: a scale around it, not a division by zero
    count = len(needle.rows)
    columns = min(COLUMNS, count)
    rows = math.ceil(count / columns)
    width = max(3.0, 0.9 * len(needle.contexts) + 1.4)  # room for a title such as "pyramidkv evict_ratio=0.75"
    figure = Figure(figsize=(columns * width + 1.2, rows * (0.45 * len(needle.depths) + 1.5) + 0.4),
                    layout="constrained")
    FigureCanvasAgg(figure)
    axes = list(figure.subplots(rows, columns, squeeze=False).flat)
    image = None
    for ax, row in zip(axes, needle.rows):
        grid = [[row.grid.get((context, depth), (math.nan, False))[0] for context in needle.contexts]
                for depth in needle.depths]
        image = ax.imshow(grid, cmap=colormaps[CMAP], vmin=low, vmax=high, aspect="auto")
        for i, depth in enumerate(needle.depths):
            for j, context in enumerate(needle.contexts):
                value, correct = row.grid.get((context, depth), (math.nan, False))
                shade = (value - low) / (high - low) if not math.isnan(value) else 0
                ax.text(j, i, f"{FOUND if correct else MISSED} {value:.1f}", ha="center", va="center", fontsize=7.5,
                        color="#000000" if shade > 0.6 else "#ffffff")
        ax.set_title(f"{row.label}\n{row.correct} of {row.cells} correct", fontsize=8.5)
        ax.set_xticks(range(len(needle.contexts)), [str(context) for context in needle.contexts], fontsize=8)
        ax.set_yticks(range(len(needle.depths)), [f"{depth}%" for depth in needle.depths], fontsize=8)
        ax.set_xlabel("context (tokens)", fontsize=8.5)
        ax.set_ylabel("needle depth", fontsize=8.5)
        ax.grid(False)
    for ax in axes[count:]:  # what the last row leaves empty
        ax.set_axis_off()
    figure.colorbar(image, ax=axes[:count], shrink=0.9, label="answer log-prob (nats)")
    return figure
