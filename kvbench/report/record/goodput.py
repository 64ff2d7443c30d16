"""A serving record's rate sweep and capacity search read back (kvbench.serving.goodput's definitions): the
targets in seconds, each replay's throughput, p99 latencies, the share of requests meeting every target and the
goodput with their Wilson intervals, each kind's capacity with its bracket, and the throughput-latency plot. The
sections render through the same layouts as the rest of a serving report. Torch-free."""

from __future__ import annotations

import io

from kvbench.report.format import plain, seconds_unit
from kvbench.report.record.sections import Cell, Column, Section
from kvbench.serving import goodput
from kvbench.serving.figures import replay_figures

INTERVAL = "Wilson score interval (binomial, 95%)"


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    scale, unit = seconds_unit((value,))
    return f"{plain(value * scale)} {unit}"


def point_rows(sweep: dict) -> list[dict]:
    """Each sweep replay's figures, attainment (when there are targets) and where it came from, in run order."""
    rows = []
    for point in sweep["points"]:
        figures = replay_figures(point["replay"])
        met = goodput.attainment(point["replay"], sweep["limits"]) if sweep["limits"] else None
        rows.append({"kind": point["kind"], "rate": point["rate"], "search": point.get("search", False),
                     "figures": figures, "attainment": met})
    return rows


def targets_text(sweep: dict) -> str:
    parts = []
    for target in sweep["targets"]:
        given = f"{target['value']:g}x the unloaded step" if target["relative"] else f"{target['value']:g} ms"
        parts.append(f"{target['name']} <= {seconds_text(sweep['limits'][target['name']])} ({given})")
    return "; ".join(parts) if parts else "none (--slo not given): no goodput"


def share_text(met: dict | None, newline: str) -> str:
    if met is None:
        return "-"
    share = f"{met['share']:.0%} ({met['good']}/{met['requests']})"
    return f"{share}{newline}[{met['share_low']:.0%}, {met['share_high']:.0%}]"


def goodput_text(met: dict | None, newline: str) -> str:
    if met is None:
        return "-"
    return f"{plain(met['goodput'], 3)}{newline}[{plain(met['goodput_low'], 3)}, {plain(met['goodput_high'], 3)}]"


def sweep_section(sweep: dict, newline: str = "\n") -> Section:
    names = ("kind", "rate /s", "probe", "req/s", "output tok/s", "ttft p99", "tbt p99", "e2e p99", "meet targets",
             "goodput req/s")
    rows = []
    for row in sorted(point_rows(sweep), key=lambda r: (sweep["kinds"].index(r["kind"]), r["rate"])):
        figures, met = row["figures"], row["attainment"]
        rows.append(tuple(Cell(text) for text in (
            row["kind"], plain(row["rate"], 4), "search" if row["search"] else "sweep",
            plain(figures["requests_per_second"], 4), plain(figures["output_tokens_per_second"], 4),
            seconds_text(figures["ttft"].get("p99")), seconds_text(figures["itl"].get("p99")),
            seconds_text(figures["e2e"].get("p99")), share_text(met, newline), goodput_text(met, newline))))
    unloaded = sweep["unloaded"]
    note = (f"Poisson arrivals at each rate, the trace's requests (one replay per kind and rate). Targets: "
            f"{targets_text(sweep)}. Unloaded decode step {seconds_text(unloaded['step_seconds'])} (median gap "
            f"between tokens of one request alone, prompt {unloaded['prompt']}, output {unloaded['output']}, "
            f"{unloaded['repeats']} replays on {unloaded['kind']}). A request meets the targets when its TTFT, "
            "its own p99 gap between tokens (and TPOT, E2E if asked) are within them; the p99 columns are over the "
            f"replay's requests (tbt: every gap). Intervals: {INTERVAL} over the replay's requests; goodput's is "
            "the share's times requests/makespan")
    columns = tuple(Column(name, left=name in ("kind", "probe"), from_record=name == "kind") for name in names)
    return Section("sweep", "rate sweep: throughput and latency at each Poisson rate", columns, tuple(rows),
                   note=note, narrow=("e2e p99", "probe", "output tok/s", "req/s"))


def capacity_items(sweep: dict) -> list[str]:
    lines = []
    for kind, search in sweep["searches"].items():
        probes = ", ".join(f"{plain(p['rate'], 4)}{'+' if p['met'] else '-'}" for p in search["probes"])
        if search["capacity"] is not None:
            found = (f"capacity {plain(search['capacity'], 4)} requests/s (within +-{goodput.TOLERANCE:.0%}: "
                     f"bracket [{plain(search['low'], 4)}, {plain(search['high'], 4)}])")
        else:
            found = f"capacity not bracketed ({search['reason']})"
        lines.append(f"{kind}: {found}, at least {sweep['attainment']:.0%} of requests meeting every target; "
                     f"{len(search['probes'])} probes from {plain(search['start'], 4)}/s (+ met, - not): {probes}")
    kinds = list(sweep["searches"])
    if len(kinds) > 1 and all(sweep["searches"][k]["capacity"] for k in kinds):
        first, other = sweep["searches"][kinds[0]], sweep["searches"][kinds[1]]
        ratio, low, high = capacity_gain(other, first)
        lines.append(f"{kinds[1]} / {kinds[0]} capacity: {ratio:.2f}x [{low:.2f}, {high:.2f}] (the brackets' ratio)")
    return lines


def capacity_gain(new: dict, old: dict) -> tuple[float, float, float]:
    """new's capacity / old's, and the interval the two brackets allow: [new low / old high, new high / old low].
    It is the searches' resolution, not replay-to-replay noise."""
    return new["capacity"] / old["capacity"], new["low"] / old["high"], new["high"] / old["low"]


def goodput_sections(sweep: dict | None, newline: str = "\n") -> list[Section]:
    if sweep is None:
        return []
    out = [sweep_section(sweep, newline)] if sweep["points"] else []
    items = capacity_items(sweep)
    if items:
        out.append(Section("capacity", "capacity: the highest Poisson rate at which enough requests meet every "
                           "target (exponential bracketing, then bisection on log rate)", items=tuple(items)))
    if sweep.get("stopped"):
        out.append(Section("sweep-stopped", warnings=(f"SWEEP STOPPED: {sweep['stopped']}",)))
    return out


def curve_plot(sweep: dict, suffix: str = ".png") -> bytes:
    """The throughput-latency curve: p99 TTFT and p99 time between tokens against achieved requests/s, one line per
    kind over its sweep and search replays, the targets dashed; and the share meeting the targets by offered rate."""
    from matplotlib import rc_context
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from kvbench.report.record.plots import DPI, RC, color

    rows = point_rows(sweep)
    panels = [("ttft", "p99 TTFT (s)", "ttft_p99"), ("itl", "p99 time between tokens (s)", "tbt_p99")]
    with rc_context(RC):
        figure = Figure(figsize=(12.6, 3.6), dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(1, 3, squeeze=False)[0]
        for kind in sweep["kinds"]:
            mine = sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["rate"])
            if not mine:
                continue
            shade = color(kind, sweep["kinds"])
            for ax, (figure_name, _, _) in zip(axes, panels):
                ax.plot([r["figures"]["requests_per_second"] for r in mine],
                        [r["figures"][figure_name]["p99"] for r in mine], marker="o", color=shade, label=kind)
            if sweep["limits"]:
                axes[2].plot([r["rate"] for r in mine], [r["attainment"]["share"] for r in mine], marker="o",
                             color=shade, label=kind)
                capacity = sweep["searches"].get(kind, {}).get("capacity")
                if capacity:
                    axes[2].axvline(capacity, color=shade, linestyle=":", linewidth=0.9)
        for ax, (_, label, target) in zip(axes, panels):
            if target in sweep["limits"]:
                ax.axhline(sweep["limits"][target], color="#d62728", linestyle="--", linewidth=0.8, label="target")
            ax.set_xlabel("achieved requests/s")
            ax.set_ylabel(label)
            ax.set_yscale("log")
            ax.legend(loc="upper left")
        axes[2].axhline(sweep["attainment"], color="#d62728", linestyle="--", linewidth=0.8)
        axes[2].set_xscale("log")
        axes[2].set_xlabel("offered Poisson rate (requests/s; dotted: capacity)")
        axes[2].set_ylabel("share meeting every target")
        axes[2].set_ylim(-0.02, 1.02)
        out = io.BytesIO()
        figure.savefig(out, format=suffix.lstrip(".") or "png", metadata={"Date": None} if suffix == ".svg" else None)
    return out.getvalue()
