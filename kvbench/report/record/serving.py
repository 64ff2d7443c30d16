"""A serving record read back: per kind, the medians over rotations of every replay figure with their
intervals, the ratios to the first kind (paired by rotation) and the A/A control; the serving table, the
throughput-latency table and the memory-over-time plot, as sections (kvbench.report.record.sections) that the
terminal, markdown and HTML layouts each render with a loop record's renderers. An interrupted record says so in
every layout. Torch-free."""

from __future__ import annotations

import io

from kvbench.measure import stats
from kvbench.measure.latency import median_with_interval
from kvbench.modes import CONTROL
from kvbench.record import RecordView
from kvbench.report.format import escape_markdown, format_bytes, plain, ratio_text, rich_escape, seconds_unit
from kvbench.report.record.prefix import prefix_figures, prefix_section
from kvbench.report.record.goodput import curve_plot, goodput_sections
from kvbench.report.record.sections import Cell, Column, Section
from kvbench.serving.trace import LENGTHS, SHAPES

HEADLINE = ("output_tokens_per_second", "requests_per_second", "mean_concurrency", "waste")


def figures_by_mode(view: RecordView) -> dict[str, dict[int, dict]]:
    """mode -> rotation -> that replay's figures (kvbench.serving.figures, through the record's view)."""
    return {cell.mode: view.serving.figures(cell) for cell in view.serving.cells()}


def pick(figures: dict, name: str) -> float | None:
    """A figure by name: 'ttft.p99' reads a percentile."""
    value = figures
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def median_interval(values: list[float]) -> dict:
    return {**median_with_interval(values), "n": len(values)}


def paired(found: dict[str, dict[int, dict]], numerator: str, denominator: str, name: str,
           between_run: float) -> dict | None:
    """numerator's figure / denominator's over rotations: the median of per-rotation ratios, rerun interval."""
    top = {r: pick(f, name) for r, f in found[numerator].items() if pick(f, name)}
    bottom = {r: pick(f, name) for r, f in found[denominator].items() if pick(f, name)}
    estimate = stats.speedup(bottom, top, between_run=between_run, key=("serving", numerator, denominator, name))
    # stats.speedup(b, t) is b / t; invert it so the ratio reads numerator / denominator
    if estimate is None:
        return None
    return {"ratio": 1 / estimate.ratio, "low": 1 / estimate.high, "high": 1 / estimate.low, "pairs": estimate.pairs}


SUMMARISED = ("output_tokens_per_second", "requests_per_second", "ttft.p50", "ttft.p99", "tpot.p50", "tpot.p99",
              "itl.p99", "e2e.p99", "queueing.p99", "max_concurrency", "mean_concurrency", "preemptions",
              "used_bytes", "reserved_bytes", "waste", "saved_bytes_max", "prefill_seconds", "decode_seconds",
              "prefill_tokens", "output_tokens_per_cpu_second", "tpot_cpu.p50", "tpot_cpu.p99")


def summarise(view: RecordView) -> dict:
    """{kinds: {kind: {figure: median with interval}}, ratios: {kind: {throughput, tpot_p99}}, control}."""
    found = figures_by_mode(view)
    between_run = view.protocol["between_run"]
    kinds = [kind for kind in view.modes if kind in found]
    summary = {"kinds": {}, "ratios": {}, "control": None}
    for kind in kinds:
        summary["kinds"][kind] = {name: median_interval([pick(f, name) for f in found[kind].values()])
                                  for name in SUMMARISED if all(pick(f, name) is not None for f in found[kind].values())}
    baseline = kinds[0] if kinds else view.modes[0]  # the first kind, replayed or not (its header names it)
    for kind in kinds[1:]:
        summary["ratios"][kind] = {
            "throughput": paired(found, kind, baseline, "output_tokens_per_second", between_run),
            "tpot_p99": paired(found, kind, baseline, "tpot.p99", between_run),
            "throughput_cpu": paired(found, kind, baseline, "output_tokens_per_cpu_second", between_run),
            "tpot_p99_cpu": paired(found, kind, baseline, "tpot_cpu.p99", between_run)}
    control = view.control
    if control and CONTROL in found:
        summary["control"] = {"kind": control, "throughput": paired(found, CONTROL, control,
                                                                     "output_tokens_per_second", between_run),
                              "throughput_cpu": paired(found, CONTROL, control, "output_tokens_per_cpu_second",
                                                       between_run)}
    summary["baseline"] = baseline
    return summary


INCOMPLETE_NOTE = "INCOMPLETE record: the run was interrupted; only the completed replays are shown"
LEFT = ("kind", "gate")
LATENCIES = ("ttft.p50", "ttft.p99", "tpot.p50", "tpot.p99", "itl.p99", "e2e.p99", "queueing.p99")


def interval_text(entry: dict | None, figures: int = 4, newline: str = "\n") -> str:
    """The median, and its interval (on a second line in a terminal, where tables must stay narrow)."""
    if not entry:
        return "-"
    low, high = plain(entry["low"], figures), plain(entry["high"], figures)
    return f"{plain(entry['median'], figures)}{newline}[{low}, {high}]"


def seconds_text(entry: dict | None, newline: str = "\n") -> str:
    """A time's median with its unit, and its interval in the same unit: "1.30 s", "[1.28, 1.51]"."""
    if not entry:
        return "-"
    scale, unit = seconds_unit((entry["median"], entry["low"], entry["high"]))
    low, high = (plain(entry[name] * scale) for name in ("low", "high"))
    return f"{plain(entry['median'] * scale)} {unit}{newline}[{low}, {high}]"


def clock_name(view: RecordView) -> str:
    """The clock every time of a table is read on: the replay's wall clock, by the timer the protocol names."""
    return f"wall clock ({view.protocol.get('clock') or 'time.perf_counter_ns'})"


def heading(view: RecordView) -> str:
    return f"kvbench serving: {view.run['preset']}, kinds {', '.join(view.modes)}"


def serving_title(view: RecordView) -> str:
    trace, budget = view.serving.trace, view.serving.budget
    lengths = trace["spec"].get("lengths")  # a record's own text: only a known name is shown
    return (f"serving: {len(trace['requests'])} requests ({lengths if lengths in (*LENGTHS, *SHAPES) else 'saved'}, arrivals "
            f"{trace['arrivals']}), KV budget {format_bytes(budget['bytes'])}; {clock_name(view)}; medians over "
            "rotations [95% interval]")


def columns_of(names: tuple[str, ...]) -> tuple[Column, ...]:
    return tuple(Column(name, left=name in LEFT, from_record=name == "kind") for name in names)


def serving_section(view: RecordView, summary: dict, newline: str = "\n") -> Section:
    """Per kind: its gate, throughput with its ratio to the first kind, concurrency, preemptions, where the time
    went, and the KV memory reserved, used, wasted and saved by sharing."""
    names = ("kind", "gate", "output tok/s", f"x {summary['baseline']}", "req/s", "concurrency max/mean", "preempt",
             "prefill tokens", "prefill/decode s", "reserved", "used", "waste", "saved by sharing")
    rows = []
    for kind, figures in summary["kinds"].items():
        passed = view.serving.checks.get(kind, {}).get("passed", False)
        cells = [kind, "pass" if passed else "FAIL",
                 interval_text(figures.get("output_tokens_per_second"), newline=newline),
                 ratio_text(summary["ratios"].get(kind, {}).get("throughput"), newline),
                 f"{figures['requests_per_second']['median']:.2f}"]
        if "max_concurrency" not in figures:  # a peer that schedules itself: tokens and times, no iterations
            cells += ["-"] * 8
        else:
            cells += [f"{figures['max_concurrency']['median']:.0f} / {figures['mean_concurrency']['median']:.1f}",
                      f"{figures['preemptions']['median']:.0f}", f"{figures['prefill_tokens']['median']:.0f}",
                      f"{figures['prefill_seconds']['median']:.1f} / {figures['decode_seconds']['median']:.1f}",
                      format_bytes(figures["reserved_bytes"]["median"]), format_bytes(figures["used_bytes"]["median"]),
                      f"{figures['waste']['median']:.1%}", format_bytes(figures["saved_bytes_max"]["median"])]
        rows.append(tuple(Cell(text, "failed" if text == "FAIL" else None) for text in cells))
    return Section("serving", serving_title(view), columns_of(names), tuple(rows),
                   narrow=("saved by sharing", "prefill tokens", "prefill/decode s", "used", "concurrency max/mean",
                           "req/s", "preempt", "reserved"))


def latency_section(view: RecordView, summary: dict, newline: str = "\n") -> Section:
    """The throughput-latency table: what each kind's throughput costs a client, each time in the unit it reads
    best in (s, ms, µs), all on the one clock its title names."""
    names = ("kind", "output tok/s", *(name.replace(".", " ") for name in LATENCIES),
             f"p99 TPOT x {summary['baseline']}")
    rows = [(kind, plain(figures["output_tokens_per_second"]["median"], 4),
             *(seconds_text(figures.get(name), newline=newline) for name in LATENCIES),
             ratio_text(summary["ratios"].get(kind, {}).get("tpot_p99"), newline))
            for kind, figures in summary["kinds"].items()]
    return Section("latency", f"throughput and latency on the {clock_name(view)}; medians over rotations [95% "
                              "interval]", columns_of(names), tuple(tuple(Cell(text) for text in row) for row in rows),
                   narrow=("queueing p99", "itl p99", "e2e p99", "output tok/s", "ttft p50", "tpot p50"))


def serving_sections(view: RecordView, newline: str = "\n", banner: bool = True) -> list[Section]:
    """Everything a serving record's report shows, in order, for every layout (`banner`: the incomplete record's
    warning as a section of its own; the HTML page draws its banner instead)."""
    summary = summarise(view)
    out = [Section("incomplete", warnings=(INCOMPLETE_NOTE,))] if banner and not view.complete else []
    out += [serving_section(view, summary, newline), latency_section(view, summary, newline)]
    cached = prefix_section(prefix_figures(view, figures_by_mode(view), paired), newline)
    out += [cached] if cached is not None else []
    control = control_sentence(summary)
    items = cpu_sentences(summary) + ([control] if control else [])
    out += [Section("ratios", items=tuple(items))] if items else []
    out += goodput_sections(view.serving.sweep, newline)
    failed = [f"EQUIVALENCE FAILED: {kind}: requests {check['failed_requests'][:5]} left the full path; it was not "
              "timed" for kind, check in view.serving.checks.items() if not check["passed"]]
    return out + ([Section("failures", warnings=tuple(failed))] if failed else [])


def cpu_sentences(summary: dict) -> list[str]:
    """Each kind's throughput and p99 TPOT ratios on the replay thread's CPU time (no waits for other processes)."""
    lines = []
    for kind, ratios in summary["ratios"].items():
        if ratios.get("throughput_cpu") and ratios.get("tpot_p99_cpu"):
            lines.append(f"on the replay thread's CPU time, {kind} / {summary['baseline']}: output throughput "
                         f"{ratio_text(ratios['throughput_cpu'], ' ')}, p99 TPOT {ratio_text(ratios['tpot_p99_cpu'], ' ')}")
    return lines


def control_sentence(summary: dict) -> str | None:
    control = summary["control"]
    if not control or not control["throughput"]:
        return None
    found = control["throughput"]
    cpu = control.get("throughput_cpu")
    on_cpu = f"; on CPU time {cpu['ratio']:.3f} [{cpu['low']:.3f}, {cpu['high']:.3f}]" if cpu else ""
    return (f"A/A control ({control['kind']} replayed twice per rotation): throughput ratio {found['ratio']:.3f} "
            f"[{found['low']:.3f}, {found['high']:.3f}]{on_cpu}, the run's noise floor")


def terminal_renderables(view: RecordView, width: int | None = None) -> list:
    """The report on a terminal (`width`: the columns a narrow one drops; None keeps every one)."""
    from kvbench.report.record.terminal import INCOMPLETE, PLAIN, section_renderables

    out: list = [f"[bold]{rich_escape(heading(view))}[/]" + ("" if view.complete else INCOMPLETE)]
    for section in serving_sections(view):
        out += section_renderables(section, width, **PLAIN, show_lines=True)
    return out


def render_markdown(view: RecordView, source: str, image: str | None = None) -> str:
    """The report as markdown; `image` is a relative link to the memory plot, if one was written."""
    from kvbench.report.record.markdown import section_lines

    lines = [f"**{escape_markdown(heading(view))}**"
             + ("" if view.complete else " — **INCOMPLETE: interrupted run**"), "",
             f"Record `{source}`, created {escape_markdown(view.environment.get('timestamp_utc', '-'))}.", ""]
    for section in serving_sections(view, newline=" "):
        lines += section_lines(section)
    if image:  # --plot: a sweep's throughput-latency curve, else the memory over time (kvbench.cli.serve)
        what = "throughput-latency curve" if view.serving.sweep and view.serving.sweep["points"] else \
            "KV memory over time, per kind"
        lines += [f"![kvbench: {what}]({image})", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_html(view: RecordView, source: str) -> str:
    """One self-contained page, as a loop record's (kvbench.report.record.html): its memory plot as a data: URI."""
    from kvbench.report.format import Html
    from kvbench.report.record.html import CSS, POLICY, data_uri, section_html

    parts = [Html('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                  '<meta http-equiv="Content-Security-Policy" content="{policy}">\n'
                  "<title>{title}</title><style>{css}</style></head><body>\n<h1>{title}</h1>").format(
                 policy=POLICY, title=heading(view), css=Html(CSS)),
             Html('<p class="meta">record <code>{}</code> · created {}</p>').format(
                 source, view.environment.get("timestamp_utc", "-"))]
    if not view.complete:
        parts.append(Html('<div class="banner">{}.</div>').format(INCOMPLETE_NOTE))
    for section in serving_sections(view, newline=" ", banner=False):
        parts += section_html(section)
    image = data_uri(memory_plot(view, ".png"), "image/png")
    parts.append(Html('<figure><img src="{}" alt="KV memory over time"><figcaption>{}</figcaption></figure>').format(
        image, "KV memory used, reserved and saved by sharing over each kind's first replay, against the budget"))
    sweep = view.serving.sweep
    if sweep and sweep["points"]:
        parts.append(Html('<figure><img src="{}" alt="throughput-latency curve"><figcaption>{}</figcaption>'
                          '</figure>').format(data_uri(curve_plot(sweep, ".png"), "image/png"),
                                              "p99 TTFT and p99 time between tokens against achieved requests/s "
                                              "per kind (targets dashed), and the share meeting every target by "
                                              "offered rate (capacity dotted)"))
    parts.append(Html("</body></html>"))
    return str(Html("\n").join(parts)) + "\n"


def report_plot(view: RecordView, suffix: str = ".png") -> bytes:
    """`kvbench report --plot` of a serving record: a sweep's throughput-latency curve, else memory over time."""
    sweep = view.serving.sweep
    return curve_plot(sweep, suffix) if sweep and sweep["points"] else memory_plot(view, suffix)


def memory_plot(view: RecordView, suffix: str = ".png") -> bytes:
    """Used, reserved and shared-saved KV bytes over time, one panel per kind, from each kind's first rotation."""
    from matplotlib import rc_context  # only a plot pays for matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from kvbench.report.record.plots import DPI, RC, color

    first = {}
    for kind in view.modes:  # in the run's order of kinds, whatever order the rotation ran them in
        first.update({kind: kept["replay"]["iterations"] for kept in view.serving.replays[::-1]
                      if kept["mode"] == kind and kept["replay"]["iterations"]})  # a peer records no memory
    with rc_context(RC):
        figure = Figure(figsize=(4.2 * max(1, len(first)), 3.2), dpi=DPI, layout="constrained")
        FigureCanvasAgg(figure)
        axes = figure.subplots(1, max(1, len(first)), sharey=True, squeeze=False)[0]
        for ax, (kind, iterations) in zip(axes, first.items()):
            times = [it["time"] for it in iterations]
            mib = 1 / 2**20
            ax.step(times, [it["reserved"] * mib for it in iterations], where="post", label="reserved",
                    color=color(kind, list(first)))
            ax.step(times, [it["used"] * mib for it in iterations], where="post", label="used by token states",
                    color="#222222", linewidth=0.9)
            if any(it["saved"] for it in iterations):
                ax.step(times, [it["saved"] * mib for it in iterations], where="post", label="saved by sharing",
                        color="#17becf", linestyle="--")
            ax.axhline(view.serving.budget["bytes"] * mib, color="#d62728", linewidth=0.8, linestyle=":", label="budget")
            ax.set_title(kind)
            ax.set_xlabel("replay time (s)")
            ax.legend(loc="lower left")
        axes[0].set_ylabel("KV memory (MiB)")
        out = io.BytesIO()
        figure.savefig(out, format=suffix.lstrip(".") or "png", metadata={"Date": None} if suffix == ".svg" else None)
    return out.getvalue()
