"""The tables' texts, defined once: the timing table's columns (a name, an alignment, a text and a
style per row) in each width's layout, and the cells and sentences of the sampling, trade-off and
fit tables and of the legend.

A column's ``text`` is plain text (``from_record`` when it carries a record's own strings,
which markdown escapes); its ``style`` names what the cell means ("failed", "invalid", "noisy",
"marks"). kvbench.report.record.sections turns these into sections, which each layout renders
with its own markup (rich styles, markdown emphasis, CSS classes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbench.measure import stats
from kvbench.measure.stats import PowerFit
from kvbench.kinds import QUANTIZED_SHARE_FLOOR
from kvbench.report.format import check_text, check_word, format_bytes, interval_name, ms, ratio
from kvbench.report.record.model import MARKS, Noise, Profile, Report, Row
from kvbench.report.record.precision import CLOCK_TEXTS, LengthRow, length_label, stop_text


@dataclass(frozen=True)
class Column:
    name: str
    text: Callable[[Row], str]
    left: bool = False  # alignment: numbers right, words left
    style: Callable[[Row], str | None] = lambda row: None
    from_record: bool = False  # the text carries a record's own strings: layouts must escape it


CLOCK_HEADS = {"wall": "wall", "cpu": "CPU"}  # a time column's header names its clock


def speedup_text(row: Row) -> str:
    if row.is_baseline:
        return "baseline"
    if row.speedup is None:
        return "-"
    text = f"{ratio(row.speedup.ratio)}x"
    if row.invalid_speedup:
        return f"({text} invalid)"
    if "disturbed" in row.marks:  # the two disagree: show both, the reader decides
        return f"{text} ({ratio(row.undisturbed.ratio)}x undisturbed)"
    return text


def short_speedup_text(row: Row) -> str:
    """The compact table's speedup with its ±: the undisturbed one is the ⚡ mark's, in --wide."""
    if row.speedup is None or row.is_baseline or row.invalid_speedup:
        return speedup_text(row)
    return f"{ratio(row.speedup.ratio)}x {precision_text(row)}"


def interval_text(row: Row) -> str:
    if row.speedup is None or row.invalid_speedup:  # an invalid speedup has no interval worth printing
        return ""
    return f"[{ratio(row.speedup.low)}, {ratio(row.speedup.high)}]"


def precision_text(row: Row) -> str:
    """The speedup's relative half-width: the precision the run achieved."""
    if row.speedup is None or row.invalid_speedup:
        return ""
    return f"±{row.speedup.half_width:.1%}"


def repetitions_text(row: Row) -> str:
    return f"{row.samples}" if row.samples == row.planned else f"{row.samples}/{row.planned}"


def bytes_pair(row: Row) -> str:
    """Retained bytes, or "retained/reserved" in one unit when the cache allocated more."""
    if row.memory is None:
        return "-"
    kept, reserved = format_bytes(row.memory["measured_bytes"]), format_bytes(row.memory["reserved_bytes"])
    if kept == reserved:
        return kept
    (kept_number, kept_unit), reserved_unit = kept.split(" "), reserved.split(" ")[1]
    return f"{kept_number}/{reserved}" if kept_unit == reserved_unit else f"{kept}/{reserved}"


def memory_bytes(key: str) -> Callable[[Row], str]:
    return lambda row: format_bytes(row.memory and row.memory[key])


def marks_of(row) -> str:
    """The symbols of a row's marks (a timing row's, or a request's latency row's)."""
    return " ".join(MARKS[name][0] for name in row.marks)



def _check_style(row: Row) -> str | None:
    if row.check is None:
        return "unchecked"
    return "failed" if row.failed else None


def _invalid(row: Row) -> str | None:
    return "invalid" if row.invalid_speedup else None


def _noisy(row: Row) -> str | None:
    return "noisy" if "noisy" in row.marks else None


MODE = Column("mode", lambda row: row.mode, left=True, from_record=True)
EQUIVALENCE = Column("equivalence", lambda row: check_text(row.check), left=True, style=_check_style,
                     from_record=True)
GATE = Column("gate", lambda row: check_word(row.check), left=True, style=_check_style)  # its numbers: --wide
MARKS_COLUMN = Column("marks", marks_of, left=True, style=lambda row: "marks")
N = Column("n", repetitions_text)
SPEEDUP = Column("speedup", speedup_text, style=_invalid)
PRECISION = Column("±", precision_text)
SHORT_SPEEDUP = Column("speedup ±", short_speedup_text, style=_invalid)


def key_column(kind: str) -> Column:
    """A loop's rows are keyed by length; a contexts run's by the context its steps follow."""
    return Column("context" if kind == "contexts" else "length", lambda row: str(row.length))


def unit_head(kind: str, clock: str) -> str:
    """The per-workload figure's header, its clock named: "CPU µs/token", "wall ms/step"."""
    return f"{CLOCK_HEADS[clock]} {'ms/step' if kind == 'contexts' else 'µs/token'}"


def unit_text(kind: str, seconds: float) -> str:
    """The per-workload figure in its header's unit: µs per token of a loop, ms per step at a context."""
    return ms(seconds) if kind == "contexts" else f"{seconds * 1e6:,.1f}"


def unit_column(kind: str, clock: str) -> Column:
    """The per-workload figure on the table's clock."""
    return Column(unit_head(kind, clock), lambda row: unit_text(kind, row.unit_seconds))


def time_columns(clock: str) -> tuple[Column, ...]:
    """Median, quartiles and spread of one sample on the table's clock; wall time beside CPU time."""
    head = CLOCK_HEADS[clock]
    out = (Column(f"{head} median ms", lambda row: ms(row.timed.median)),
           Column(f"{head} q1–q3 ms", lambda row: f"{ms(row.timed.q1)}–{ms(row.timed.q3)}"),
           Column("IQR %", lambda row: f"{row.timed.spread:.0%}", style=_noisy))
    if clock != "wall":
        out += (Column("wall median ms", lambda row: ms(row.median)),)
    return out


LAYOUTS = ("wide", "standard", "compact")  # a terminal takes the first that fits (`--wide`: the first)


def row_columns(report: Report, clock: str, layout: str) -> tuple[Column, ...]:
    """The timing table's columns for one clock: a terminal's "wide" (`--wide`), "standard" (about 132 columns)
    or "compact" (80), or "document" (markdown and HTML: every number in its own column)."""
    key, unit = key_column(report.kind), unit_column(report.kind, clock)
    if layout == "compact":
        return key, MODE, unit, SHORT_SPEEDUP, GATE, MARKS_COLUMN
    median, quartiles, spread, *wall = time_columns(clock)
    if layout == "standard":
        return (key, MODE, N, median, spread, *wall, unit, SPEEDUP, PRECISION, Column("KV bytes", bytes_pair), GATE,
                MARKS_COLUMN)
    interval = Column(report.interval_name, interval_text, style=_invalid)
    if layout == "wide":
        return (key, MODE, N, median, quartiles, spread, *wall, unit, SPEEDUP, PRECISION, interval,
                Column("KV bytes", bytes_pair), EQUIVALENCE, MARKS_COLUMN)
    return (key, MODE, N, median, quartiles, spread, *wall, unit, SPEEDUP, interval,
            Column("KV bytes", memory_bytes("measured_bytes")), Column("reserved", memory_bytes("reserved_bytes")),
            EQUIVALENCE, MARKS_COLUMN)


def sampling_columns(report: Report) -> tuple[str, ...]:
    """The sampling table's header: its rows are keyed as the run's workload keys them, and the A/A control's
    interval is named as the record computed it."""
    return ({"request": "request", "contexts": "context"}.get(report.kind, "length"), "rotations", "stopped",
            "widest ±", "A/A ratio", f"A/A {interval_name(report.control_interval, report.confidence)}", "A/A ±", "clock")


def sampling_cells(row: LengthRow, workload: dict | None = None) -> list[str]:
    floor = row.control
    return [length_label(workload or {}, row.length).split(" ")[-1], str(row.rotations), stop_text(row),
            "" if row.half_width is None else f"±{row.half_width:.1%}",
            "" if floor is None else f"{floor.ratio:.3f}", "" if floor is None else f"[{floor.low:.3f}, {floor.high:.3f}]",
            "" if floor is None else f"±{floor.half_width:.1%}", CLOCK_TEXTS.get(row.clock, row.clock)]


def speedup_legend(report: Report) -> str:
    """What the speedup and its interval are, in one sentence."""
    if report.estimator == "ratio-of-medians" and report.interval == "percentile bootstrap":
        return (f"speedup = median {report.baseline} / median mode; {report.interval_name} (this record predates the "
                f"rerun interval) over repetition indices (pairs from the same rotation kept together), "
                f"{stats.RESAMPLES:,} resamples, seed {stats.SEED}")
    what = stats.ESTIMATORS.get(report.estimator, report.estimator)
    allowance = f" combined with {report.between_run:.1%} variation between runs" if report.between_run else ""
    interval = (f"{report.interval_name}: where an identical rerun's speedup falls (this run's order-statistic interval "
                f"of the median{allowance}, widened by √2)") if report.interval.startswith("rerun") else \
        f"{report.interval_name}: {stats.INTERVALS.get(report.interval, report.interval)}"
    return f"speedup = {what}; {interval}; ± = its relative half-width"


def sampling_sentence(report: Report) -> str:
    if report.control is None:
        return "no A/A control in this run (kvbench run --control none)"
    return (f"A/A control: {report.control} timed twice in every rotation; its ratio is 1 but for noise, so its "
            f"interval is the run's noise floor")


def noise_sentence(noise: Noise) -> str:
    reasons = ", ".join(f"{reason} {count / noise.samples:.0%}" for reason, count in noise.reasons.items())
    line = (f"noise: {noise.disturbed} of {noise.samples} samples disturbed ({noise.disturbed / noise.samples:.0%}"
            + (f": {reasons}" if reasons else "") + ")")
    if noise.telemetry_seconds:
        line += (f"; telemetry costs {noise.telemetry_seconds * 1e6:.0f} µs a sample (outside the timed region), "
                 f"{noise.telemetry_seconds / noise.shortest_sample:.1%} of the shortest sample")
    if noise.unavailable:
        line += "; not measured: " + ", ".join(f"{name} ({why})" for name, why in noise.unavailable.items())
    return line

FIT_COLUMNS = ("mode", "b", "± SE", "95% interval of b", "a (s)", "R²", "b, two longest")


def fit_cells(fit: PowerFit | None) -> list[str]:
    """b, its standard error, the CI on b, a, R^2, and the slope between the two longest lengths."""
    if fit is None:
        return ["-", "", "", "", "", ""]
    if fit.b_stderr is None:
        return [f"{fit.b:.2f}", "n/a", "n/a (2 lengths)", f"{fit.a:.3g}", "", f"{fit.tail_b:.2f}"]
    return [f"{fit.b:.2f}", f"{fit.b_stderr:.2f}", f"[{fit.b_low:.2f}, {fit.b_high:.2f}]",
            f"{fit.a:.3g}", f"{fit.r_squared:.3f}", f"{fit.tail_b:.2f}"]


def profile_sentences(profile: Profile, baseline: str) -> list[str]:
    lines = [f"per-step profile of one loop at length {profile.length} "
             f"(running median over {profile.window} steps):"]
    if not profile.crossovers:
        lines.append(f"  no {baseline!r} profile to compare against: no crossover")
    for mode, step in profile.crossovers.items():
        last_full, last_mine = profile.smoothed[baseline][-1], profile.smoothed[mode][-1]
        tail = (f"last step {last_full * 1e6:,.0f} µs {baseline} vs {last_mine * 1e6:,.0f} µs {mode} "
                f"({profile.final_speedups[mode]:.1f}x)")
        if step is None:
            lines.append(f"  {mode}: caching does not pay within {profile.length} steps; {tail}")
        else:
            lines.append(f"  {mode}: cheaper than {baseline} from step {step} on; {tail}")
    return lines


def tradeoff_columns(kind: str, clock: str) -> tuple[str, ...]:
    """The trade-off table's header: its time on one clock, named as the timing table of that clock names it."""
    return ("length", "mode", "KV bytes", "of float", "quantized", "judged", "max |Δ|", "KL mean", "top-1",
            unit_head(kind, clock), "speedup")


def tradeoff_cells(entry, kind: str = "loop") -> list[str]:
    check = entry.check or {}
    lossy = check.get("exact", True) is False
    judged = ("drift within limits" if check.get("passed") else "drift beyond limits") if lossy else \
        ("exact" if check.get("passed") else "FAILED")
    held = "" if entry.quantized is None else f"{entry.quantized / entry.length:.0%}" + (
        f" {MARKS['unquantized'][0]}" if entry.quantized < QUANTIZED_SHARE_FLOOR * entry.length else "")
    return [str(entry.length), entry.mode, format_bytes(entry.nbytes), f"{entry.bytes_ratio:.2f}", held, judged,
            f"{check['max_abs_diff']:.1e}" if check.get("max_abs_diff") is not None else "-",
            f"{check['kl_mean']:.1e}" if lossy else "0", f"{check['top1_agreement']:.1%}" if lossy else "100%",
            unit_text(kind, entry.unit_seconds), f"{entry.speedup.ratio:.2f}x" if entry.speedup else "-"]


TRADEOFF_SENTENCE = ("bytes kept (of the float formula at that length), the share of positions a quantized kind held "
                     f"quantized at the end ({MARKS['unquantized'][0]}: below {QUANTIZED_SHARE_FLOOR:.0%}, mostly its "
                     "full-precision residual), how far the logits drift from the full prefix on the timed ids (KL of "
                     "next-token distributions, top-1 agreement), and time per token on the clock its header names, the "
                     "timing table's at that length. An exact kind is judged by the tolerance; a lossy kind by its own "
                     "limits, never called exact")
FIT_SENTENCE = ("least squares on log(median time) against log(length). A full-prefix loop grows like T² to T³, a "
                "cached loop like T to T²; fixed overhead at short lengths pulls b down, so the slope between the two "
                "longest lengths shows where the growth is heading")


def unquantized_sentences(report: Report) -> list[str]:
    """Each quantized kind's cell (and quality row) that held less than QUANTIZED_SHARE_FLOOR of its positions
    quantized, in words: `kvbench run` warns of them on stderr, as the tables mark them."""
    marked: dict[str, list[Row]] = {}
    for row in report.rows:
        if "unquantized" in row.marks:
            marked.setdefault(row.mode, []).append(row)
    out = [f"{mode} held " + ", ".join(f"{row.quantized} of {row.length}" for row in rows) + " positions quantized "
           f"at length {', '.join(str(row.length) for row in rows)} (below {QUANTIZED_SHARE_FLOOR:.0%}): the rest sat "
           "in its full-precision residual, so its bytes and drift there are mostly float's; longer lengths or a "
           "smaller --quant-residual measure the format" for mode, rows in marked.items()]
    out += [f"{row.label}'s quality on text held {row.quantized} of each {row.held}-token chunk quantized "
            f"({row.quantized / row.held:.0%}), so its perplexity and KL there are mostly float's"
            for row in report.quality if "unquantized" in row.marks]
    return out

