"""A serving record read back: per kind, the medians over rotations of every replay figure with their
intervals, the ratios to the first kind (paired by rotation) and the A/A control; the serving table, the
throughput-latency table and the memory-over-time plot. Torch-free."""

from __future__ import annotations

import io

from rich import box
from rich.table import Table

from kvbench.measure import stats
from kvbench.measure.latency import median_with_interval
from kvbench.report.format import format_bytes, rich_escape
from kvbench.serving.figures import replay_figures

SERVING_SCHEMA = "kvbench.serving/1"
CONTROL = "control"
HEADLINE = ("output_tokens_per_second", "requests_per_second", "mean_concurrency", "waste")


def figures_by_mode(record: dict) -> dict[str, dict[int, dict]]:
    """mode -> rotation -> that replay's figures (kvbench.serving.figures)."""
    found: dict[str, dict[int, dict]] = {}
    for kept in record["samples"]:
        found.setdefault(kept["mode"], {})[kept["repetition"]] = replay_figures(kept["replay"])
    return found


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


def summarise(record: dict) -> dict:
    """{kinds: {kind: {figure: median with interval}}, ratios: {kind: {throughput, tpot_p99}}, control}."""
    found = figures_by_mode(record)
    between_run = record["protocol"]["between_run"]
    kinds = [kind for kind in record["kinds"] if kind in found]
    summary = {"kinds": {}, "ratios": {}, "control": None}
    for kind in kinds:
        summary["kinds"][kind] = {name: median_interval([pick(f, name) for f in found[kind].values()])
                                  for name in SUMMARISED if all(pick(f, name) is not None for f in found[kind].values())}
    baseline = kinds[0] if kinds else None
    for kind in kinds[1:]:
        summary["ratios"][kind] = {
            "throughput": paired(found, kind, baseline, "output_tokens_per_second", between_run),
            "tpot_p99": paired(found, kind, baseline, "tpot.p99", between_run),
            "throughput_cpu": paired(found, kind, baseline, "output_tokens_per_cpu_second", between_run),
            "tpot_p99_cpu": paired(found, kind, baseline, "tpot_cpu.p99", between_run)}
    control = record.get("control")
    if control and CONTROL in found:
        summary["control"] = {"kind": control, "throughput": paired(found, CONTROL, control,
                                                                     "output_tokens_per_second", between_run),
                              "throughput_cpu": paired(found, CONTROL, control, "output_tokens_per_cpu_second",
                                                       between_run)}
    summary["baseline"] = baseline
    return summary


def _interval(entry: dict | None, scale: float = 1.0, digits: str = ".3g") -> str:
    """The median, and its interval on a second line (tables stay narrow enough for a terminal)."""
    if not entry:
        return "-"
    return f"{entry['median'] * scale:{digits}}\n[{entry['low'] * scale:{digits}}, {entry['high'] * scale:{digits}}]"


def _ratio(entry: dict | None) -> str:
    return "-" if not entry else f"{entry['ratio']:.2f}x\n[{entry['low']:.2f}, {entry['high']:.2f}]"


def serving_table(record: dict, summary: dict) -> Table:
    trace, budget = record["trace"], record["budget"]
    title = (f"serving: {len(trace['requests'])} requests ({trace['spec'].get('lengths', 'saved')}, arrivals "
             f"{trace['arrivals']}), KV budget {format_bytes(budget['bytes'])}; medians over rotations [95% interval]")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_lines=True)
    for name in ("kind", "gate", "output tok/s", f"x {summary['baseline']}", "req/s", "concurrency max/mean",
                 "preempt", "prefill tokens", "prefill/decode s", "reserved", "used", "waste", "saved by sharing"):
        table.add_column(name, justify="left" if name in ("kind", "gate") else "right")
    for kind, figures in summary["kinds"].items():
        check = record["checks"].get(kind, {"passed": False})
        if "max_concurrency" not in figures:  # a peer that schedules itself: tokens and times, no iterations
            table.add_row(rich_escape(kind), "pass" if check["passed"] else "FAIL",
                          _interval(figures.get("output_tokens_per_second"), digits=".4g"),
                          _ratio(summary["ratios"].get(kind, {}).get("throughput")),
                          f"{figures['requests_per_second']['median']:.2f}", *["-"] * 8)
            continue
        table.add_row(rich_escape(kind), "pass" if check["passed"] else "FAIL",
                      _interval(figures.get("output_tokens_per_second"), digits=".4g"),
                      _ratio(summary["ratios"].get(kind, {}).get("throughput")),
                      f"{figures['requests_per_second']['median']:.2f}",
                      f"{figures['max_concurrency']['median']:.0f} / {figures['mean_concurrency']['median']:.1f}",
                      f"{figures['preemptions']['median']:.0f}", f"{figures['prefill_tokens']['median']:.0f}",
                      f"{figures['prefill_seconds']['median']:.1f} / {figures['decode_seconds']['median']:.1f}",
                      format_bytes(figures["reserved_bytes"]["median"]),
                      format_bytes(figures["used_bytes"]["median"]), f"{figures['waste']['median']:.1%}",
                      format_bytes(figures["saved_bytes_max"]["median"]))
    return table


def latency_table(summary: dict) -> Table:
    """The throughput-latency table: what each kind's throughput costs a client, in milliseconds."""
    table = Table(title="throughput and latency (ms; medians over rotations [95% interval])", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_lines=True)
    names = ("ttft.p50", "ttft.p99", "tpot.p50", "tpot.p99", "itl.p99", "e2e.p99", "queueing.p99")
    for name in ("kind", "output tok/s", *names, f"p99 TPOT x {summary['baseline']}"):
        table.add_column(name.replace(".", " "), justify="left" if name == "kind" else "right")
    for kind, figures in summary["kinds"].items():
        table.add_row(rich_escape(kind), f"{figures['output_tokens_per_second']['median']:.4g}",
                      *(_interval(figures.get(name), 1e3) for name in names),
                      _ratio(summary["ratios"].get(kind, {}).get("tpot_p99")))
    return table


def cpu_sentences(summary: dict) -> list[str]:
    """Each kind's throughput and p99 TPOT ratios on the replay thread's CPU time (no waits for other processes)."""
    lines = []
    for kind, ratios in summary["ratios"].items():
        if ratios.get("throughput_cpu") and ratios.get("tpot_p99_cpu"):
            lines.append(f"on the replay thread's CPU time, {kind} / {summary['baseline']}: output throughput "
                         f"{_ratio(ratios['throughput_cpu']).replace(chr(10), ' ')}, p99 TPOT "
                         f"{_ratio(ratios['tpot_p99_cpu']).replace(chr(10), ' ')}")
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


def memory_plot(record: dict, suffix: str = ".png") -> bytes:
    """Used, reserved and shared-saved KV bytes over time, one panel per kind, from each kind's first rotation."""
    from matplotlib import rc_context  # only a plot pays for matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from kvbench.report.record.plots import DPI, RC, color

    first = {}
    for kind in record["kinds"]:  # in the run's order of kinds, whatever order the rotation ran them in
        first.update({kind: kept["replay"]["iterations"] for kept in record["samples"][::-1]
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
            ax.axhline(record["budget"]["bytes"] * mib, color="#d62728", linewidth=0.8, linestyle=":", label="budget")
            ax.set_title(kind)
            ax.set_xlabel("replay time (s)")
            ax.legend(loc="lower left")
        axes[0].set_ylabel("KV memory (MiB)")
        out = io.BytesIO()
        figure.savefig(out, format=suffix.lstrip(".") or "png", metadata={"Date": None} if suffix == ".svg" else None)
    return out.getvalue()
