"""Two serving records of one trace held side by side (`kvbench compare`), and the measures every exporter carries
for a serving record (kvbench.export.serving). Torch-free.

A measure is one figure of a replay (kvbench.serving.figures) taken once per rotation: per kind, its median over
the rotations with the order-statistic interval of a median (as `kvbench report` prints it), and between two
records NEW / OLD with the interval, minimum detectable effect and verdict every comparison uses
(kvbench.report.comparison.verdicts), each record's interval widened by stats.BETWEEN_RUN["seconds"], how much a run-level
median moves between runs. A measure that is zero on either side (no preemption, no waste) has no ratio: the
comparison shows NEW - OLD instead.

Two more guards keep a compare of two runs of the same code from crying wolf, as a loop compare's do:
- the A/A floor, per measure: each record's A/A control (one kind replayed twice per rotation) shows how far the
  same measure of two replays of the same code lies apart in that run, rotation by rotation; a change no larger
  than the largest such gap of either record is "within noise";
- Holm–Bonferroni over every measure of every kind compared (about 16 per kind;
  kvbench.report.comparison.significance): a "worse" or "better" must also be significant after Holm's step-down
  correction of its Welch p-value at --alpha, or it becomes "within noise". Holm keeps the chance of any false
  alarm among them at alpha without assuming the measures independent (TTFT p50, p90 and p99 move together).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import math

from kvbench.measure import stats
from kvbench.measure.latency import median_with_interval
from kvbench.record import RecordView
from kvbench.report.comparison.differences import Difference, environment_diff
from kvbench.report.format import plain, seconds_unit
from kvbench.report.record.serving import figures_by_mode, pick
from kvbench.modes import CONTROL
from kvbench.report.comparison.significance import holm, welch_p
from kvbench.report.comparison.verdicts import FASTER, SLOWER, WITHIN_NOISE, Change, change


@dataclass(frozen=True)
class Measure:
    """One figure of a replay: its name in the figures (kvbench.serving.figures), unit and direction."""

    key: str  # "output_tokens_per_second", "ttft.p99": kvbench.report.record.serving.pick reads it
    unit: str  # the unit of its values: "tokens/s", "requests/s", "s", "fraction", "count"
    higher_is_better: bool
    meaning: str

    @property
    def name(self) -> str:
        """The key as one word, for exported names: "ttft_p99"."""
        return self.key.replace(".", "_")


LATENCY_MEANINGS = {
    "ttft": "time to first token, arrival to first token",
    "tpot": "time per output token after the first, (last - first) / (tokens - 1)",
    "itl": "inter-token latency, every gap of every request pooled",
    "e2e": "end-to-end latency, arrival to last token",
}
MEASURES = (
    Measure("output_tokens_per_second", "tokens/s", True, "output tokens per second of replay (makespan)"),
    Measure("requests_per_second", "requests/s", True, "requests finished per second of replay (makespan)"),
    *(Measure(f"{figure}.p{level}", "s", False, f"{meaning}: the replay's {level}th percentile over requests")
      for figure, meaning in LATENCY_MEANINGS.items() for level in (50, 90, 99)),
    Measure("waste", "fraction", False, "KV memory reserved but holding no token state, time-weighted over the "
                                        "replay: 1 - used / reserved"),
    Measure("preemptions", "count", False, "requests preempted (recomputed) in the replay"),
)


def replayed(view: RecordView) -> RecordView:
    """The view of a serving record with a replay to compare or export; ValueError naming the file when it kept
    none (every kind failed its check, or the run was interrupted before a replay)."""
    if not view.serving.replays:
        raise ValueError(f"{view.source}: a serving record without a replay: repetitions: none was kept "
                         f"({'every kind failed its check' if view.complete else 'interrupted'})")
    return view


def per_rotation(view: RecordView) -> dict[str, dict[str, dict[int, float]]]:
    """kind -> measure name -> rotation -> value, for the record's kinds (not its A/A control's replays)."""
    found = figures_by_mode(view)
    out = {}
    for kind in view.modes:
        if kind not in found:
            continue
        out[kind] = {measure.name: {rotation: pick(figures, measure.key) for rotation, figures in found[kind].items()}
                     for measure in MEASURES}
        out[kind] = {name: values for name, values in out[kind].items()
                     if values and all(value is not None for value in values.values())}  # a peer has no waste
    return out


def median_low_high(values: list[float]) -> tuple[float, float, float]:
    """The median over rotations and its order-statistic interval (kvbench.measure.latency.median_with_interval), as a
    triple."""
    found = median_with_interval(values)
    return found["median"], found["low"], found["high"]


@dataclass(frozen=True)
class MeasureChange:
    """One measure of one kind in both records."""

    kind: str
    old_kind: str
    measure: Measure
    old: tuple[float, float, float]  # median, low, high over OLD's rotations
    new: tuple[float, float, float]
    change: Change | None  # NEW / OLD with interval, MDE and verdict; None when either side has a zero
    verdict: str  # "better", "worse", "unchanged", "within noise", or "-" without a ratio
    p_value: float | None = None  # two-sided, of NEW / OLD = 1; None without a ratio

    @property
    def difference(self) -> float:
        return self.new[0] - self.old[0]


@dataclass
class ServingComparison:
    old_source: str
    new_source: str
    environment: list[Difference]
    changes: list[MeasureChange]
    skipped: list[str]
    notes: list[str]
    floors: dict[str, float] = dataclasses.field(default_factory=dict)  # measure -> A/A floor, as |log ratio|

    @property
    def regressions(self) -> list[MeasureChange]:
        return [c for c in self.changes if c.verdict == "worse"]


def estimate(values: list[float]) -> stats.RatioEstimate:
    return stats.median_estimate(values, stats.BETWEEN_RUN["seconds"])


def measure_change(kind: str, old_kind: str, measure: Measure, old: list[float], new: list[float], factor: float,
                   alpha: float, floor: float = 0.0) -> MeasureChange:
    """One measure's change, its verdict held to the MDE and to the A/A `floor` (|log ratio| the same code drifts
    by in these runs); Holm's correction comes after, over every measure (holm)."""
    shown = median_low_high(old), median_low_high(new)
    if min(old + new) <= 0:
        return MeasureChange(kind, old_kind, measure, *shown, None, "-")
    judged = change(estimate(old), estimate(new), factor=factor, alpha=alpha)
    p_value = welch_p(old, new)
    # the verdict's words are about cost: a higher throughput is what a lower latency is
    worse, better = (FASTER, SLOWER) if measure.higher_is_better else (SLOWER, FASTER)
    verdict = {worse: "worse", better: "better"}.get(judged.verdict, judged.verdict)
    if verdict in ("worse", "better") and abs(math.log(judged.ratio)) <= floor:
        verdict = WITHIN_NOISE
    return MeasureChange(kind, old_kind, measure, *shown, judged, verdict, p_value)


def held_to_holm(changes: list[MeasureChange], alpha: float) -> list[MeasureChange]:
    """Holm–Bonferroni over every change with a ratio (significance.holm): a "worse" or "better" it does not reject
    becomes "within noise"."""
    tested = [item for item in changes if item.p_value is not None]
    rejected = {id(item) for item, kept in zip(tested, holm([item.p_value for item in tested], alpha)) if kept}
    return [item if item.verdict not in ("worse", "better") or id(item) in rejected
            else dataclasses.replace(item, verdict=WITHIN_NOISE) for item in changes]


def aa_floors(view: RecordView) -> dict[str, float]:
    """measure -> the largest |log(control's value / its kind's value)| over the record's rotations: how far that
    measure of two replays of the same code lay apart in this run (empty without an A/A control)."""
    found = figures_by_mode(view)
    control, kind = found.get(CONTROL, {}), found.get(view.control, {})
    floors = {}
    for measure in MEASURES:
        gaps = [abs(math.log(a / b)) for rotation in control.keys() & kind.keys()
                for a, b in [(pick(control[rotation], measure.key), pick(kind[rotation], measure.key))]
                if a and b and a > 0 and b > 0]
        if gaps:
            floors[measure.name] = max(gaps)
    return floors


def same_trace_problem(old: RecordView, new: RecordView) -> str | None:
    """Why two serving records did not replay the same work, or None."""
    for left, right, what in ((old.serving.trace, new.serving.trace, "trace"), (old.config, new.config, "model"),
                              (old.serving.budget["bytes"], new.serving.budget["bytes"], "KV budget")):
        if left != right:
            return f"a different {what}"
    return None


def compare_serving(old: RecordView, new: RecordView, *, factor: float, alpha: float,
                    mapping: dict[str, str] | None = None) -> ServingComparison:
    """Every kind both records replayed (`mapping` {NEW kind: OLD kind} lines up differently named kinds)."""
    mapping = mapping or {}
    old_values, new_values = per_rotation(old), per_rotation(new)
    changes, skipped = [], []
    old_floors, new_floors = aa_floors(old), aa_floors(new)
    floors = {name: max(old_floors.get(name, 0.0), new_floors.get(name, 0.0)) for name in old_floors | new_floors}
    for kind, measured in new_values.items():
        old_kind = mapping.get(kind, kind)
        if old_kind not in old_values:
            skipped.append(f"NEW's {kind}")
            continue
        for measure in MEASURES:
            if measure.name in measured and measure.name in old_values[old_kind]:
                changes.append(measure_change(kind, old_kind, measure, list(old_values[old_kind][measure.name]
                                                                            .values()),
                                              list(measured[measure.name].values()), factor, alpha,
                                              floors.get(measure.name, 0.0)))
    skipped += [f"OLD's {kind}" for kind in old_values if kind not in {mapping.get(k, k) for k in new_values}]
    notes = [f"{name} is INCOMPLETE (interrupted run): only its completed replays are compared"
             for name, view in (("OLD", old), ("NEW", new)) if not view.complete]
    notes += [f"{name}'s {kind} FAILED its gate" for name, view in (("OLD", old), ("NEW", new))
              for kind, check in view.serving.checks.items() if not check["passed"]]
    return ServingComparison(old.source, new.source, environment_diff(old.environment, new.environment),
                             held_to_holm(changes, alpha), skipped, notes, floors)


LABELS = {"output_tokens_per_second": "output tok/s", "requests_per_second": "req/s"}  # what a row calls a measure


def label(measure: Measure) -> str:
    """A measure as a narrow table names it: "output tok/s", "TTFT p99", "waste"."""
    figure, _, level = measure.key.partition(".")
    return LABELS.get(measure.key) or (f"{figure.upper()} {level}" if level else figure)


def scaled(measure: Measure, values: tuple[float, ...]) -> tuple[list[str], str]:
    """The values as one row shows them, and their unit: times in the unit their largest reads best in (s, ms,
    µs), never in scientific notation; a fraction as %; a rate as a plain number (its unit is in its label)."""
    if measure.unit == "s":
        scale, unit = seconds_unit(values)
        return [plain(value * scale) for value in values], unit
    if measure.unit == "fraction":
        return [f"{value:.1%}" for value in values], ""
    if measure.unit == "count":
        return [f"{value:g}" if abs(value) < 1e6 else plain(value) for value in values], ""
    return [plain(value, 4) for value in values], ""


def shown(measure: Measure, figure: tuple[float, float, float], newline: str = "\n") -> str:
    (median, low, high), unit = scaled(measure, figure)
    return f"{median}{' ' + unit if unit else ''}{newline}[{low}, {high}]"


def change_texts(item: MeasureChange, newline: str = "\n") -> list[str]:
    """kind, measure, OLD [interval], NEW [interval], NEW / OLD [interval] (or NEW - OLD), MDE, verdict."""
    kind = item.kind if item.kind == item.old_kind else f"{item.kind} (OLD {item.old_kind})"
    if item.change is None:
        delta = item.difference
        (size,), unit = scaled(item.measure, (abs(delta),))
        ratio = f"{'+' if delta >= 0 else '-'}{size}{' ' + unit if unit else ''}{newline}(NEW - OLD)"
        mde = "-"
    else:
        ratio = f"{item.change.ratio:.3f}x{newline}[{item.change.low:.3f}, {item.change.high:.3f}]"
        mde = f"±{item.change.mde:.1%}"
    return [kind, label(item.measure), shown(item.measure, item.old, newline), shown(item.measure, item.new, newline),
            ratio, mde, item.verdict]


HEADER = ("kind", "measure", "OLD median [95%]", "NEW median [95%]", "NEW / OLD [95%]", "MDE", "verdict")
NARROW = ("MDE", "kind")  # what a narrow terminal drops, in order (kind then heads each kind's rows); never the verdict

ABOUT = ("serving records: per kind, each measure's median over rotations [95% order-statistic interval] on the wall "
         "clock; NEW / OLD [95% interval, each side widened by between-run variation], MDE and verdict "
         "(kvbench.report.comparison.verdicts); a change is judged beyond noise only past its A/A floor and under "
         "Holm–Bonferroni over every measure compared")


def environment_lines(c: ServingComparison) -> list[str]:
    if not c.environment:
        return ["environment: identical"]
    return [f"environment ({d.rank}): {d.key}: {d.old} -> {d.new}" for d in c.environment]


def other_lines(c: ServingComparison) -> list[str]:
    return ([f"skipped (not in both records): {', '.join(c.skipped)}"] if c.skipped else []) + \
        [f"note: {note}" for note in c.notes]


def floor_line(c: ServingComparison) -> str:
    tested = len([item for item in c.changes if item.p_value is not None])
    if not c.floors:
        return f"A/A floor: none (neither record ran an A/A control); Holm–Bonferroni over {tested} measures"
    throughput = c.floors.get("output_tokens_per_second")
    return ("A/A floor per measure: the largest gap between the A/A control's replays and its kind's in either "
            "record" + (f" (output tok/s: ±{math.expm1(throughput):.1%})" if throughput is not None else "")
            + f"; Holm–Bonferroni over {tested} measures (Welch p-values)")


def comparison_table(c: ServingComparison, shown: tuple[str, ...]):
    from rich import box
    from rich.table import Table

    from kvbench.report.format import rich_escape

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in shown:
        table.add_column(name, justify="left" if name in ("kind", "measure", "verdict") else "right", no_wrap=True,
                         min_width=len(WITHIN_NOISE) if name == "verdict" else None)  # the longest verdict, whole
    previous = None
    for item in c.changes:
        texts = dict(zip(HEADER, change_texts(item)))
        if "kind" not in shown and texts["kind"] != previous:  # the kind heads its rows instead of a column
            table.add_row(f"[bold]{rich_escape(texts['kind'])}[/]", *[""] * (len(shown) - 1))
        previous = texts["kind"]
        table.add_row(*(rich_escape(texts[name]) for name in shown))
    return table


def compare_renderables(c: ServingComparison, width: int | None = None) -> list:
    """The comparison on a terminal of `width` columns (None: every column): where the table is wider, the MDE
    column goes, then the kind becomes a heading row; the verdict column is never dropped or cut."""
    from kvbench.report.format import rich_escape
    from kvbench.report.record.terminal import natural_width

    out: list = [f"[bold]kvbench compare[/]  OLD {rich_escape(c.old_source)}  →  NEW {rich_escape(c.new_source)}",
                 *map(rich_escape, environment_lines(c)), rich_escape(ABOUT), rich_escape(floor_line(c))]
    shown, hidden = HEADER, []
    table = comparison_table(c, shown)
    for name in NARROW:
        if width is None or natural_width(table) < width:  # rich keeps the last column off the terminal's edge
            break
        shown, hidden = tuple(column for column in shown if column != name), [*hidden, name]
        table = comparison_table(c, shown)
    if "MDE" in hidden:
        table.caption, table.caption_justify = "not shown at this width: MDE (COLUMNS wider shows it)", "left"
    return [*out, table, *map(rich_escape, other_lines(c))]


def render_markdown(c: ServingComparison) -> str:
    from kvbench.report.format import escape_markdown, markdown_table

    lines = [f"**kvbench compare** OLD `{c.old_source}` → NEW `{c.new_source}`", "",
             *(f"- {escape_markdown(line)}" for line in environment_lines(c)), "", escape_markdown(ABOUT), ""]
    lines += [escape_markdown(floor_line(c)), ""]
    lines += markdown_table(HEADER, [[escape_markdown(text) for text in change_texts(item, " ")] for item in c.changes],
                            left=("kind", "measure", "verdict"))
    lines += ["", *(f"- {escape_markdown(line)}" for line in other_lines(c))]
    return "\n".join(lines).rstrip() + "\n"
