"""What every exporter writes, computed once per record: the cells, the machine, the commit.

Each timed cell of a record becomes a `Cell`: its raw seconds in the order they ran (what one
sample covers depends on the workload: a whole loop, a whole request, a context's timed steps),
its median with a 95% rerun interval, and for a cached mode the speedup over the baseline with
the record's own rerun interval (kvbench.report.record.model.row_speedup, as `kvbench report` prints it).
Both intervals say where an identical rerun's number would fall. A request or contexts cell also
carries the figures the report shows for it (kvbench.export.figures: TTFT, TPOT, ITL percentiles;
the steady-state and the first step), each with its per-sample values. The machine and the commit
come from the environment the record captured, never from the machine that exports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvbench.config import PRESETS, PlainConfig
from kvbench.export.figures import Figure, figure_facts, figures_by_cell, sample_meaning
from kvbench.measure import stats
from kvbench.measure.stats import RatioEstimate
from kvbench.measure.timing import Protocol
from kvbench.record import RecordView
from kvbench.report.record.model import row_speedup

INTERVAL = "95% rerun interval: where an identical rerun's number falls (docs/statistics.md)"
UNKNOWN_MACHINE = "unknown-machine"


@dataclass(frozen=True)
class Quantity:
    """A measure of a cell that is not seconds (a serving replay's throughput, waste, preemptions), in its unit:
    its median over samples with the 95% order-statistic interval of a median, and the per-sample values."""

    name: str  # "output_tokens_per_second", "waste", "preemptions"
    unit: str  # "tokens/s", "requests/s", "fraction", "count"
    value: float
    low: float
    high: float
    values: list[float]
    higher_is_better: bool
    meaning: str


@dataclass(frozen=True)
class Cell:
    """One timed (mode, length) cell of a record."""

    case: str  # the preset, whatever the run changed from it and its workload: "seed", "seed,layers=2", "seed,contexts"
    mode: str
    length: int
    seconds: list[float]  # every sample, in the order it was taken
    median: RatioEstimate  # median seconds, 95% rerun interval
    speedup: RatioEstimate | None  # baseline / mode with the record's rerun interval; None for the baseline
    speedup_valid: bool  # both this mode and the baseline passed the equivalence check
    passed: bool  # this mode passed its equivalence (or drift) check
    baseline: str
    sample: str = "one whole decode loop"  # what the seconds of one sample cover
    figures: list[Figure] = field(default_factory=list)  # a request's or a contexts run's, as the report shows them
    series: dict[str, list[float]] = field(default_factory=dict)  # each figure's per-sample values, by Figure.series
    quantities: list[Quantity] = field(default_factory=list)  # a serving replay's measures that are not seconds

    @property
    def key(self) -> str:
        return f"{self.case}/{self.mode}/{self.length}"

    @property
    def cost(self) -> RatioEstimate | None:
        """mode / baseline, the cost relative to the full prefix (1 / speedup): lower is better, as for seconds."""
        s = self.speedup
        return None if s is None else RatioEstimate(1 / s.ratio, 1 / s.high, 1 / s.low, s.pairs, s.estimator, s.interval)


@dataclass(frozen=True)
class Source:
    """A record as the exporters see it."""

    path: str
    created_utc: str
    status: str
    environment: dict
    protocol: dict
    cells: list[Cell]

    def fact(self, section: str, key: str):
        holder = self.environment.get(section)
        return holder.get(key) if isinstance(holder, dict) else None

    @property
    def machine(self) -> str:
        """The machine's name: the hostname the record captured."""
        return self.fact("os", "hostname") or UNKNOWN_MACHINE

    @property
    def commit(self) -> str | None:
        return self.fact("kvbench", "git_commit")

    @property
    def dirty(self) -> bool:
        return bool(self.fact("kvbench", "git_dirty"))

    @property
    def branch(self) -> str | None:
        return self.fact("kvbench", "git_branch")


def changed_fields(preset: str, config: dict) -> list[str]:
    """"key=value" for every model field of `config` that differs from the preset's."""
    base = PlainConfig.from_preset(preset).to_dict() if preset in PRESETS else {}
    return [f"{key}={value}" for key, value in sorted(config.items()) if key not in base or base[key] != value]


def case_name(view: RecordView) -> str:
    """The case a cell belongs to: the preset, then every model field, batch and thread count that differs from
    it, then the workload when it is not the loop (a request's prompt and generated tokens; contexts): each has a
    name of its own, so an engine never lines a request or a context's steps up with a loop's history."""
    preset = view.run["preset"]
    changed = changed_fields(preset, view.config)
    workload = view.workload
    if workload.is_request:
        changed += [f"prompt={workload.prompt}", f"generate={workload.generate}"]
    elif workload.kind == "contexts":
        changed.append("contexts")
    defaults = Protocol()
    for key in ("batch", "threads"):
        if view.run[key] != getattr(defaults, key):
            changed.append(f"{key}={view.run[key]}")
    return ",".join([preset, *changed])


def rerun_median(view: RecordView, mode: str, length: int) -> RatioEstimate:
    return stats.rerun_interval(stats.median_estimate(view.seconds(mode, length), view.between_run["seconds"]))


def cells_of(view: RecordView) -> list[Cell]:
    name, baseline, cells = case_name(view), view.baseline, []
    sample, figures = sample_meaning(view), figures_by_cell(view)
    for mode, length in view.cells():
        seconds = [rep["seconds"] for rep in view.repetitions(mode, length)]
        speedup = None
        if mode != baseline and view.samples(baseline, length):
            speedup = row_speedup(view, mode, length, stats.SEED, stats.RESAMPLES)
        cells.append(Cell(name, mode, length, seconds, rerun_median(view, mode, length), speedup,
                          view.passed(mode, length) and view.passed(baseline, length), view.passed(mode, length),
                          baseline, sample, *figures.get((mode, length), ([], {}))))
    return cells


def source_of(view: RecordView) -> Source:
    return Source(view.source, view.created_utc, view.status, view.environment, view.protocol, cells_of(view))


def sources_of(views: list[RecordView | Source]) -> list[Source]:
    """Every record's cells (a serving record comes as its Source already: kvbench.export.serving); ValueError
    when two records measured the same cell on the same machine, which one document cannot hold twice."""
    sources = [view if isinstance(view, Source) else source_of(view) for view in views]
    seen = {}
    for source in sources:
        for cell in source.cells:
            where = (source.machine, cell.key)
            if where in seen:
                raise ValueError(f"{seen[where]} and {source.path} both measured {cell.key} on machine "
                                 f"{source.machine}; export them to separate files")
            seen[where] = source.path
    return sources


def one_machine(sources: list[Source], format_name: str, reason: str) -> str:
    """The single machine of `sources`; ValueError naming them when there are several."""
    machines = sorted({source.machine for source in sources})
    if len(machines) > 1:
        raise ValueError(f"{format_name} holds one machine per file ({reason}); these records come from "
                         f"{', '.join(machines)}: export each machine's records to its own file")
    return machines[0]


def finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value}")
    return float(value)


def cell_facts(cell: Cell, source: Source) -> dict:
    """The flat facts every format's free-form field carries: what a sample is, interval, speedup, check, the
    figures of a request or contexts cell, machine, commit."""
    facts = {"sample": cell.sample, "median_s": cell.median.ratio, "median_low_s": cell.median.low,
             "median_high_s": cell.median.high, "samples": len(cell.seconds), "interval": INTERVAL,
             "equivalence": "passed" if cell.passed else "FAILED"}
    if cell.speedup is not None:
        facts.update({f"speedup_vs_{cell.baseline}": cell.speedup.ratio, "speedup_low": cell.speedup.low,
                      "speedup_high": cell.speedup.high, "speedup_valid": cell.speedup_valid,
                      "speedup_estimator": cell.speedup.estimator})
    facts.update(figure_facts(cell.figures))
    facts.update(quantity_facts(cell.quantities))
    facts.update({"machine": source.machine, "cpu": source.fact("cpu", "brand"),
                  "torch": source.fact("torch", "version"), "commit": source.commit, "dirty": source.dirty,
                  "record": source.path, "record_created_utc": source.created_utc, "record_status": source.status})
    return facts


def quantity_facts(quantities: list[Quantity]) -> dict:
    """The flat facts of a cell's quantities, each key naming its unit: value, interval, meaning."""
    facts = {}
    for quantity in quantities:
        facts.update({quantity.name: quantity.value, f"{quantity.name}_low": quantity.low,
                      f"{quantity.name}_high": quantity.high, f"{quantity.name}_unit": quantity.unit,
                      f"{quantity.name}_meaning": quantity.meaning})
    return facts
