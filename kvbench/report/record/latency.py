"""What a client sees, as rows and texts: a request run's TTFT, TPOT, ITL percentiles, E2E and tokens/s,
and how close each step came to the machine's limits (bandwidth and matmul).

The numbers are the record's summary (kvbench.measure.latency computed them from the raw per-step
durations when the record was written, and again when it was loaded); this module only
arranges them for the layouts, as columns.py does for the timing table.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from kvbench.config import PlainConfig
from kvbench.measure import latency, stats
from kvbench.measure.stats import RatioEstimate
from kvbench.modes import TRANSFORMERS, expected_bytes, source_of
from kvbench.record import RecordView
from kvbench.report.format import check_text, check_word, format_bytes, ms


@dataclass(frozen=True)
class LatencyRow:
    mode: str
    prompt: int
    generate: int
    requests: int
    figures: dict  # kvbench.measure.latency.mode_latency, as the summary holds it
    ratios: dict  # "ttft" / "tpot" -> {"ratio", "low", "high", "pairs"}: the baseline's figure / this mode's
    check: dict | None
    valid: bool
    marks: tuple[str, ...] = ()  # its cell's marks (kvbench.report.record.model.MARKS), set by the report


def latency_rows(view: RecordView) -> list[LatencyRow]:
    workload = view.workload
    if not workload.is_request:
        return []
    rows = []
    for mode, length in view.cells():  # the run's modes in order; the A/A control is the sampling table's
        entry = view.latency(mode, length)
        if entry is None or mode not in view.modes:
            continue
        rows.append(LatencyRow(mode, workload.prompt, workload.generate, entry["requests"], entry,
                               entry["ratios"], view.check(mode, length),
                               view.passed(mode, length) and view.passed(view.baseline, length)))
    return rows


LATENCY_COLUMNS = ("mode", "n", "TTFT ms [95% interval]", "TPOT ms [95% interval]", "ITL p50 / p90 / p99 ms",
                   "E2E ms", "tokens/s", "TTFT ×", "TPOT ×", "equivalence")
LATENCY_COMPACT = ("mode", "TTFT ms", "TPOT ms", "ITL p50/p99 ms", "TPOT ×", "gate")  # a narrow terminal


def figure_text(figure: dict | None) -> str:
    if not figure:
        return ""
    return f"{ms(figure['median'])} [{ms(figure['low'])}, {ms(figure['high'])}]"


def ratio_text(ratio: dict | None, valid: bool, digits: int = 1) -> str:
    """A ratio with its relative half-width (`digits` decimals of the percentage: 0 in a narrow table)."""
    if not ratio:
        return ""
    if not valid:
        return "invalid"
    half = (ratio["high"] - ratio["low"]) / (2 * ratio["ratio"])
    return f"{ratio['ratio']:.2f}x ±{half:.{digits}%}"


def latency_cells(row: LatencyRow) -> list[str]:
    f = row.figures
    itl = " / ".join(ms(f[f"itl_p{level}"]) for level in (50, 90, 99)) if "itl_p50" in f else ""
    return [row.mode, str(row.requests), figure_text(f.get("ttft")), figure_text(f.get("tpot")), itl,
            ms(f["e2e"]["median"]), f"{f['tokens_per_second']['median']:,.1f}",
            ratio_text(row.ratios.get("ttft"), row.valid), ratio_text(row.ratios.get("tpot"), row.valid),
            check_text(row.check)]


def compact_figure_text(figure: dict | None) -> str:
    """A median with its interval's relative half-width, for a narrow table."""
    return f"{ms(figure['median'])} ±{(figure['high'] - figure['low']) / (2 * figure['median']):.0%}" if figure else ""


def latency_compact_cells(row: LatencyRow) -> list[str]:
    f = row.figures
    itl = "/".join(ms(f[f"itl_p{level}"]) for level in (50, 99)) if "itl_p50" in f else ""
    return [row.mode, compact_figure_text(f.get("ttft")), compact_figure_text(f.get("tpot")), itl,
            ratio_text(row.ratios.get("tpot"), row.valid, digits=0), check_word(row.check)]


def timer_sentence(view: RecordView) -> str:
    """What timing every step cost it, against the shortest step reported ("" when not measured)."""
    cost = view.sampling["telemetry"].get("per_step_timer_seconds")  # measured by request runs
    steps = [s for mode, length in view.cells() for rep in view.repetitions(mode, length) for s in rep["step_seconds"]]
    if cost is None or not steps:
        return ""
    return f"; reading the clock between steps costs {cost * 1e9:.0f} ns a step, {cost / min(steps):.2%} of the shortest step"


def latency_sentence(rows: list[LatencyRow], baseline: str, timer: str = "") -> str:
    first = rows[0]
    return (f"One request per sample: a prompt of {first.prompt} tokens prefilled in one call, then "
            f"{first.generate - 1} one-token steps ({first.generate} tokens generated), teacher-forced. TTFT: the "
            f"prefill, up to the first token's logits; TPOT = (E2E - TTFT) / (N - 1), as vLLM defines it; ITL "
            f"percentiles pool every step of every request; medians with their 95% intervals. TTFT × and TPOT ×: "
            f"{baseline}'s figure / the mode's, the median over rotations, with the rerun interval (±){timer}")


@dataclass(frozen=True)
class LimitRow:
    """How close one measured step (or prefill) came to what the machine can stream and multiply."""

    mode: str
    what: str  # "decode @ C" or "prefill P"
    seconds: float  # median
    bytes_read: float
    flops: float
    bandwidth: float | None  # the measured triad bandwidth on the run's threads
    compute: float | None  # the fastest measured matmul
    matmul_floor: float | None = None  # seconds its matmuls take at the rates measured at their shapes

    @property
    def achieved_bandwidth(self) -> float:
        return latency.achieved_bandwidth(self.bytes_read, self.seconds)

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.seconds


def limit_rows(view: RecordView) -> list[LimitRow]:
    """Contexts runs: every cached mode's step at every context; request runs: every mode's prefill and
    every cached mode's average decode step (at the request's middle context)."""
    limits = view.limits
    if not limits:
        return []
    config, batch, weights = PlainConfig.from_dict(view.config), view.batch, limits["weight_bytes_per_step"]
    roofs = (latency.bandwidth_limit(limits, view.threads), latency.compute_limit(limits))
    rows = []
    if view.workload.kind == "contexts":
        for mode, length in view.cells():
            memory = view.memory(mode, length)
            if mode == view.baseline or mode not in view.modes or memory is None:
                continue
            step = latency.decode_step(weights, memory["measured_bytes"], config, batch, length)
            rows.append(LimitRow(mode, f"decode @ {length}", context_step_seconds(view, mode, length),
                                 step["bytes"], step["flops"], *roofs, latency.matmul_floor(config, batch, limits)))
    for row in latency_rows(view):
        work = latency.prefill(weights, config, batch, row.prompt)
        rows.append(LimitRow(row.mode, f"prefill {row.prompt}", row.figures["ttft"]["median"], work["bytes"],
                             work["flops"], *roofs, latency.matmul_floor(config, batch * row.prompt, limits)))
        if row.mode != view.baseline and "tpot" in row.figures:
            middle = row.prompt + row.generate // 2
            step = latency.decode_step(weights, expected_bytes(row.mode, config, batch, middle, nominal=True,
                                                               **view.cache_options(row.mode)),
                                       config, batch, middle)
            rows.append(LimitRow(row.mode, f"decode @ {middle} (TPOT)", row.figures["tpot"]["median"], step["bytes"],
                                 step["flops"], *roofs, latency.matmul_floor(config, batch, limits)))
    return rows


def context_step_seconds(view: RecordView, mode: str, length: int) -> float:
    """A contexts run's per-step figure: the median steady-state step; a record from before the timed window
    holds one cold step per sample (its cache's release timed with it), shown as it was."""
    warmup = view.workload.warmup_steps
    if warmup is None:
        return statistics.median(view.speedup_samples(mode, length).values())
    return latency.context_latency(view.repetitions(mode, length), warmup)["step"]["median"]


@dataclass(frozen=True)
class ContextRow:
    mode: str
    context: int
    figures: dict  # kvbench.measure.latency.context_latency: "step", "first_step", "samples"
    check: dict | None
    valid: bool
    marks: tuple[str, ...] = ()  # its cell's marks (kvbench.report.record.model.MARKS), set by the report


def context_rows(view: RecordView) -> list[ContextRow]:
    """A contexts run with a timed window (every record since 2026-12-03): per context and mode, the steady-state
    step and the first step after the prefill."""
    if not view.workload.timed_window:
        return []
    return [ContextRow(mode, length, latency.context_latency(view.repetitions(mode, length), view.workload.warmup_steps),
                       view.check(mode, length), view.passed(mode, length))
            for length in view.lengths for mode in view.modes if view.repetitions(mode, length)]


CONTEXT_COLUMNS = ("context", "mode", "n", "wall step ms [95% interval]", "wall first step ms [95% interval]",
                   "first / step", "equivalence")  # each step's own timer reads wall time: its clock named


def context_cells(row: ContextRow) -> list[str]:
    step, first = row.figures["step"], row.figures["first_step"]
    return [str(row.context), row.mode, str(row.figures["samples"]), figure_text(step), figure_text(first),
            f"{first['median'] / step['median']:.2f}x", check_text(row.check)]


def context_sentence(view: RecordView) -> str:
    workload = view.workload
    return (f"Per sample and context c: a fresh cache, a prefill of c tokens and {workload.warmup_steps} warm-up "
            f"steps, untimed, then {workload.timed_steps} consecutive steps, each timed on its own; the cache is "
            f"released after them, untimed. step: the mean of the timed steps, the per-token cost at that context "
            f"(the speedups compare the timed windows); first step: the one right after the prefill, paid once per "
            f"prompt; medians over samples with their 95% intervals")


LIMIT_COLUMNS = ("mode", "step", "wall ms", "reads", "GB/s", "% of bandwidth", "GFLOP/s", "% of matmul",
                 "matmul floor ms")


def limit_cells(row: LimitRow) -> list[str]:
    share = lambda value, roof: "" if roof is None else f"{value / roof:.0%}"  # noqa: E731
    return [row.mode, row.what, ms(row.seconds), format_bytes(int(row.bytes_read)), f"{row.achieved_bandwidth / 1e9:.2f}",
            share(row.achieved_bandwidth, row.bandwidth), f"{row.achieved_flops / 1e9:.2f}",
            share(row.achieved_flops, row.compute), "" if row.matmul_floor is None else ms(row.matmul_floor)]


def limit_sentence(view: RecordView) -> str:
    limits = view.limits
    bandwidth, compute = latency.bandwidth_limit(limits, view.threads), latency.compute_limit(limits)
    when = (f"at the start of each of its {len(limits['rounds'])} rounds, beside the samples (medians)"
            if limits.get("rounds") else "once, before the samples")
    where = f"the {limits['device']} device" if limits.get("device") else f"{view.threads} thread(s)"
    return (f"The machine's limits, measured in this run {when}: triad {bandwidth / 1e9:.1f} GB/s on {where} "
            f"over {format_bytes(limits['buffer_bytes'])} arrays, matmul {compute / 1e9:.1f} GFLOP/s at the "
            f"model's shapes. A decode step must read every weight once ({format_bytes(limits['weight_bytes_per_step'])}"
            f", embedding rows aside) and the cache it attends to; % of bandwidth is those bytes over the step's median "
            f"time against triad, % of matmul its FLOPs against the fastest matmul; matmul floor: the time its matrix "
            f"products take at the rates measured at their own shapes")


def step_quartiles(view: RecordView) -> dict[str, list[tuple[float, float, float]]]:
    """A request run: per mode, the (first quartile, median, third quartile) over its requests of each step's
    duration (step j at context P + j)."""
    if not view.workload.is_request:
        return {}
    out = {}
    for mode, length in view.cells():
        if mode in view.modes:
            steps = [rep["step_seconds"] for rep in view.repetitions(mode, length)]
            out[mode] = [quartiles(column) for column in zip(*steps)] if steps else []
    return out


def quartiles(values) -> tuple[float, float, float]:
    if len(values) < 2:  # one request: no spread to show
        return (values[0],) * 3
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


# -- kvbench's caches against transformers' on the same weights, in the same rotations ------------


@dataclass(frozen=True)
class PeerRow:
    length: int
    mode: str  # kvbench's fastest exact kind at this length (lowest median)
    peer: str  # an exact transformers cache (hf-dynamic, hf-static)
    ratio: RatioEstimate  # mode seconds / peer seconds: median of per-rotation ratios, rerun interval
    valid: bool  # both passed the gate


def peer_rows(view: RecordView) -> list[PeerRow]:
    """Per length, kvbench's fastest exact cached kind over each exact transformers cache the run timed:
    per-token time as a ratio (below 1, kvbench's step is faster), paired by rotation, with the record's interval.
    Empty without an hf-* mode, and for a request run (its latency table compares TPOT per mode)."""
    if view.workload.is_request:
        return []
    exact = lambda mode, length: (view.check(mode, length) or {}).get("exact", True)  # noqa: E731
    rows = []
    for length in view.lengths:
        timed = [mode for mode in view.modes if view.summary(mode, length) and mode != view.baseline
                 and exact(mode, length)]
        peers = [mode for mode in timed if source_of(mode) == TRANSFORMERS]
        ours = [mode for mode in timed if source_of(mode) != TRANSFORMERS]
        if not peers or not ours:
            continue
        fastest = min(ours, key=lambda mode: view.summary(mode, length)["median"])
        for peer in peers:
            estimate = stats.speedup(view.speedup_samples(fastest, length), view.speedup_samples(peer, length),
                                     estimator=view.estimation(length)["estimator"], interval=view.interval,
                                     between_run=view.recorded_between_run, key=("peer", fastest, peer, length))
            if estimate is not None:
                rows.append(PeerRow(length, fastest, peer, estimate,
                                    view.passed(fastest, length) and view.passed(peer, length)))
    return rows


def peer_columns(contexts: bool, interval: str) -> tuple[str, ...]:
    """The peers table's columns: its rows are keyed by context in a contexts run, by length in a loop; `interval`
    names the record's interval, which the ratios carry (kvbench.report.record.model.interval_name)."""
    return ("context" if contexts else "length", "kvbench", "transformers", "kvbench / transformers", interval, "pairs")


def peer_cells(row: PeerRow) -> list[str]:
    if not row.valid:
        return [str(row.length), row.mode, row.peer, "invalid", "", str(row.ratio.pairs)]
    return [str(row.length), row.mode, row.peer, f"{row.ratio.ratio:.2f}x",
            f"[{row.ratio.low:.2f}, {row.ratio.high:.2f}]", str(row.ratio.pairs)]


PEER_NOTE = ("kvbench / transformers = median over rotations of kvbench's step (or loop) time over transformers' on the "
             "same weights, each pair from one rotation, with the run's interval; below 1 kvbench is faster. kvbench's "
             "side is its fastest exact kind at that length")
