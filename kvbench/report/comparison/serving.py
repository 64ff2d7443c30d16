"""Two serving records of one trace held side by side (`kvbench compare`), and the measures every exporter carries
for a serving record (kvbench.export.serving). Torch-free.

A measure is one figure of a replay (kvbench.serving_figures) taken once per rotation: per kind, its median over
the rotations with the order-statistic interval of a median (as `kvbench report` prints it), and between two
records NEW / OLD with the interval, minimum detectable effect and verdict every comparison uses
(kvbench.report.comparison.verdicts), each record's interval widened by stats.BETWEEN_RUN["seconds"], how much a run-level
median moves between runs. A measure that is zero on either side (no preemption, no waste) has no ratio: the
comparison shows NEW - OLD instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvbench import stats
from kvbench.latency import median_with_interval
from kvbench.record.serving import SERVING_SCHEMA, check_serving_record, is_serving
from kvbench.report.comparison.differences import Difference, environment_diff
from kvbench.report.record.serving import figures_by_mode, pick
from kvbench.report.comparison.verdicts import FASTER, SLOWER, Change, change


@dataclass(frozen=True)
class Measure:
    """One figure of a replay: its name in the figures (kvbench.serving_figures), unit and direction."""

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


def serving_record(document: object, source: Path | str) -> dict | None:
    """A document read from `source` as a serving record with a replay to compare or export; None for any other
    JSON (a kvbench record: the caller, which read the file once, validates it as one), ValueError naming the file
    and the field for a malformed serving record (kvbench.record.serving checks it before anything is computed)."""
    if not is_serving(document):
        return None
    check_serving_record(document, source)
    if not document["samples"]:
        raise ValueError(f"{source}: a serving record ({SERVING_SCHEMA!r}) without a replay: samples: none was kept "
                         f"({'every kind failed its check' if document.get('complete', True) else 'interrupted'})")
    return document


def per_rotation(record: dict) -> dict[str, dict[str, dict[int, float]]]:
    """kind -> measure name -> rotation -> value, for the record's kinds (not its A/A control's replays)."""
    found = figures_by_mode(record)
    out = {}
    for kind in record["kinds"]:
        if kind not in found:
            continue
        out[kind] = {measure.name: {rotation: pick(figures, measure.key) for rotation, figures in found[kind].items()}
                     for measure in MEASURES}
        out[kind] = {name: values for name, values in out[kind].items()
                     if values and all(value is not None for value in values.values())}  # a peer has no waste
    return out


def median_low_high(values: list[float]) -> tuple[float, float, float]:
    """The median over rotations and its order-statistic interval (kvbench.latency.median_with_interval), as a
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

    @property
    def regressions(self) -> list[MeasureChange]:
        return [c for c in self.changes if c.verdict == "worse"]


def estimate(values: list[float]) -> stats.RatioEstimate:
    return stats.median_estimate(values, stats.BETWEEN_RUN["seconds"])


def measure_change(kind: str, old_kind: str, measure: Measure, old: list[float], new: list[float], factor: float,
                   alpha: float) -> MeasureChange:
    shown = median_low_high(old), median_low_high(new)
    if min(old + new) <= 0:
        return MeasureChange(kind, old_kind, measure, *shown, None, "-")
    judged = change(estimate(old), estimate(new), factor=factor, alpha=alpha)
    # the verdict's words are about cost: a higher throughput is what a lower latency is
    worse, better = (FASTER, SLOWER) if measure.higher_is_better else (SLOWER, FASTER)
    verdict = {worse: "worse", better: "better"}.get(judged.verdict, judged.verdict)
    return MeasureChange(kind, old_kind, measure, *shown, judged, verdict)


def same_trace_problem(old: dict, new: dict) -> str | None:
    """Why two serving records did not replay the same work, or None."""
    for key, what in (("trace", "trace"), ("config", "model"), ("budget", "KV budget")):
        left, right = old[key], new[key]
        if key == "budget":
            left, right = left.get("bytes"), right.get("bytes")
        if left != right:
            return f"a different {what}"
    return None


def compare_serving(old: dict, new: dict, old_source: str, new_source: str, *, factor: float, alpha: float,
                    mapping: dict[str, str] | None = None) -> ServingComparison:
    """Every kind both records replayed (`mapping` {NEW kind: OLD kind} lines up differently named kinds)."""
    mapping = mapping or {}
    old_values, new_values = per_rotation(old), per_rotation(new)
    changes, skipped = [], []
    for kind, measured in new_values.items():
        old_kind = mapping.get(kind, kind)
        if old_kind not in old_values:
            skipped.append(f"NEW's {kind}")
            continue
        for measure in MEASURES:
            if measure.name in measured and measure.name in old_values[old_kind]:
                changes.append(measure_change(kind, old_kind, measure, list(old_values[old_kind][measure.name]
                                                                            .values()),
                                              list(measured[measure.name].values()), factor, alpha))
    skipped += [f"OLD's {kind}" for kind in old_values if kind not in {mapping.get(k, k) for k in new_values}]
    notes = [f"{name} is INCOMPLETE (interrupted run): only its completed replays are compared"
             for name, record in (("OLD", old), ("NEW", new)) if not record.get("complete", True)]
    notes += [f"{name}'s {kind} FAILED its gate" for name, record in (("OLD", old), ("NEW", new))
              for kind, check in record["checks"].items() if not check["passed"]]
    return ServingComparison(old_source, new_source, environment_diff(old["environment"], new["environment"]),
                             changes, skipped, notes)


def scaled(measure: Measure, values: tuple[float, ...]) -> tuple[list[str], str]:
    """The values as one row shows them, and their unit: seconds below one as ms, a fraction as %."""
    if measure.unit == "s" and max(values) < 1:
        return [f"{value * 1e3:.3g}" for value in values], "ms"
    if measure.unit == "fraction":
        return [f"{value:.1%}" for value in values], ""
    if measure.unit == "count":
        return [f"{value:g}" for value in values], ""
    return [f"{value:.4g}" for value in values], measure.unit


def shown(measure: Measure, figure: tuple[float, float, float]) -> str:
    (median, low, high), unit = scaled(measure, figure)
    return f"{median} [{low}, {high}]" + (f" {unit}" if unit else "")


def change_texts(item: MeasureChange) -> list[str]:
    """kind, measure, OLD [interval], NEW [interval], NEW / OLD [interval] (or NEW - OLD), MDE, verdict."""
    kind = item.kind if item.kind == item.old_kind else f"{item.kind} (OLD {item.old_kind})"
    if item.change is None:
        delta = item.difference
        (size,), unit = scaled(item.measure, (abs(delta),))
        ratio = f"{'+' if delta >= 0 else '-'}{size}{' ' + unit if unit else ''} (NEW - OLD)"
        mde = "-"
    else:
        ratio = f"{item.change.ratio:.3f}x [{item.change.low:.3f}, {item.change.high:.3f}]"
        mde = f"±{item.change.mde:.1%}"
    return [kind, item.measure.key, shown(item.measure, item.old), shown(item.measure, item.new), ratio, mde,
            item.verdict]


HEADER = ("kind", "measure", "OLD median [95% interval]", "NEW median [95% interval]", "NEW / OLD [95% interval]",
          "MDE", "verdict")

ABOUT = ("serving records: per kind, each measure's median over rotations [95% order-statistic interval]; NEW / OLD "
         "[95% interval, each side widened by between-run variation], MDE and verdict (kvbench.report.comparison.verdicts)")


def environment_lines(c: ServingComparison) -> list[str]:
    if not c.environment:
        return ["environment: identical"]
    return [f"environment ({d.rank}): {d.key}: {d.old} -> {d.new}" for d in c.environment]


def other_lines(c: ServingComparison) -> list[str]:
    return ([f"skipped (not in both records): {', '.join(c.skipped)}"] if c.skipped else []) + \
        [f"note: {note}" for note in c.notes]


def compare_renderables(c: ServingComparison) -> list:
    from rich import box
    from rich.table import Table

    from kvbench.report.format import rich_escape

    out: list = [f"[bold]kvbench compare[/]  OLD {rich_escape(c.old_source)}  →  NEW {rich_escape(c.new_source)}",
                 *map(rich_escape, environment_lines(c)), rich_escape(ABOUT)]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for name in HEADER:
        table.add_column(name, justify="left" if name in ("kind", "measure", "verdict") else "right", no_wrap=True)
    for item in c.changes:
        table.add_row(*map(rich_escape, change_texts(item)))
    return [*out, table, *map(rich_escape, other_lines(c))]


def render_markdown(c: ServingComparison) -> str:
    from kvbench.report.format import escape_markdown, markdown_table

    lines = [f"**kvbench compare** OLD `{c.old_source}` → NEW `{c.new_source}`", "",
             *(f"- {escape_markdown(line)}" for line in environment_lines(c)), "", escape_markdown(ABOUT), ""]
    lines += markdown_table(HEADER, [[escape_markdown(text) for text in change_texts(item)] for item in c.changes],
                            left=("kind", "measure", "verdict"))
    lines += ["", *(f"- {escape_markdown(line)}" for line in other_lines(c))]
    return "\n".join(lines).rstrip() + "\n"
