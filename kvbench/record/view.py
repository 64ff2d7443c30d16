"""RecordView: read-only access to a validated record, indexed once, for every reader."""

from __future__ import annotations

from pathlib import Path

from kvbench import modes
from kvbench.config import PlainConfig
from kvbench.measure import estimation, stats
from kvbench.record.entries import CellKey, Repetition, Workload
from kvbench.record.schema import validate_record
from kvbench.record.store import load_record
from kvbench.record.summary import by_cell, control_interval, samples_by_cell
from kvbench.record.upgrade import upgrade
from kvbench.serving.figures import replay_figures, request_latencies


class RecordView:
    """Read-only access to a validated record, indexed once: every reader goes through it.

    The record is in the current schema (an older one was upgraded on load), so nothing here or in a
    reader defaults a section by the record's age. Cells are (mode, length) pairs (kvbench.record.entries
    .CellKey, equal to the plain tuple). The record's sections are attributes (status, created_utc, command,
    config, run, protocol, environment, baseline, modes, lengths, workload, limits, machine_probe, ...);
    accessors return the record's own entries (do not modify them) or None where the record has none for
    that cell.
    """

    def __init__(self, record: dict, source: str = "record") -> None:
        record = upgrade(record)  # an older record handed over unvalidated: the one shape all the same
        self.record = record
        self.source = source
        self.status: str = record["status"]
        self.complete = self.status == "complete"
        self.created_utc: str = record["created_utc"]
        self.command: list[str] = list(record["command"])
        # Every field, the derived ones and those a record from before them lacks (their defaults: the gpt2
        # family) filled in, so that two records of one model show the same config.
        self.config: dict = PlainConfig.from_dict(record["config"]).to_dict()
        self.run: dict = record["run"]
        self.protocol: dict = record["protocol"]
        self.environment: dict = record["environment"]
        self.workload = Workload.from_dict(self.run["workload"])
        self.modes: list[str] = list(self.run["modes"])
        self.control: str | None = self.run["control"]
        self.serving: ServingView | None = None
        if self.workload.is_serving:  # its own cells, no grid of lengths: kvbench.record.serving
            self._index_serving(record)
            return
        summary = record["summary"]
        self.baseline: str = summary["baseline"]
        self.lengths: list[int] = list(self.run["lengths"])
        self.planned_repeats: int = self.run["repeats"]
        self.batch: int = self.run["batch"]
        self.threads: int = self.run["threads"]
        self.per_step: list[dict] = record.get("per_step", [])  # a run with a profile (--per-step) has one
        self.estimator: str | None = summary["estimator"]  # None: schema 1, ratio of medians
        self.interval: str | None = summary["interval"]
        self.controls: list[dict] = summary["controls"]
        # What varies between runs of the same code that one run cannot show; records written before it
        # was recorded get the defaults when compared (their own intervals stay as they were written).
        self.between_run: dict = dict(summary["between_run"] or stats.BETWEEN_RUN)
        self.recorded_between_run: float = (summary["between_run"] or {"speedup": 0.0})["speedup"]
        # The A/A control's interval, as the writer chose it; None for a ratio-of-medians (schema 1) record
        self.control_interval: str | None = (control_interval(self.interval, summary["between_run"])
                                             if self.estimator is not None else None)
        self.machine_probe: dict | None = record.get("machine_probe")  # None: runs before 2026-12-01
        # The machine's limits (kvbench.measure.machine): request and contexts runs since 2026-12-01; None otherwise
        self.limits: dict | None = record.get("limits")
        # A real model's run (kvbench.models.gguf, workloads.quality, .needle): its file, token ids, quality, retrieval
        self.model_file: dict | None = record.get("model")
        self.token_ids: dict | None = record.get("token_ids")
        self.quality: dict | None = record.get("quality")
        self.needle: dict | None = record.get("needle")
        self.sampling: dict = record["sampling"]
        self._sampling = {entry["length"]: entry for entry in self.sampling["lengths"]}
        self._repetitions: dict[CellKey, list[dict]] = {}
        for rep in record["repetitions"]:
            self._repetitions.setdefault(CellKey.of(rep), []).append(rep)
        self._samples = samples_by_cell(record["repetitions"])
        self._latency = by_cell(summary.get("latency", []))  # request runs only
        self._estimation = {entry["length"]: entry for entry in (summary["estimation"] or {"lengths": []})["lengths"]}
        self._clocked = {clock: estimation.series(record["repetitions"], clock)
                         for clock in {entry["clock"] for entry in self._estimation.values()} - {"wall"}}
        self._checks = by_cell(record["checks"])
        self._memory = by_cell(record["memory"])
        self._summaries = by_cell(record["summary"]["cells"])
        self._speedups = by_cell(record["summary"]["speedups"])

    def _index_serving(self, record: dict) -> None:
        """A serving record: the loop's sections are empty (no lengths, no summary: its figures are derived from
        the replays' stamps), its own are under `serving` (a ServingView)."""
        self.lengths, self.per_step, self.baseline = [], [], self.modes[0]
        self.planned_repeats, self.batch, self.threads = self.run["repeats"], self.run["batch"], self.run["threads"]
        self.machine_probe = self.limits = self.model_file = self.token_ids = self.quality = self.needle = None
        self.serving = ServingView(record)
        self.sampling = record["sampling"]
        for name in ("_repetitions", "_samples", "_latency", "_estimation", "_clocked", "_checks", "_memory",
                     "_summaries", "_speedups", "_sampling"):
            setattr(self, name, {})

    @classmethod
    def load(cls, path: Path | str) -> RecordView:
        return cls(load_record(path), str(path))

    @classmethod
    def of(cls, document: object, source: Path | str) -> RecordView:
        """A document already read from `source` (a file a caller read once to see its schema), validated as
        `load` validates a file."""
        return cls(validate_record(document, str(source)), str(source))

    def grid(self) -> list[CellKey]:
        """Every planned cell in the run's order: lengths outer, modes inner (a serving run's: one per kind)."""
        if self.serving is not None:
            return [self.serving.cell(mode) for mode in self.modes]
        return [CellKey(mode, length) for length in self.lengths for mode in self.modes]

    def cells(self) -> list[CellKey]:
        """The planned cells that have at least one repetition, in the run's order (a serving run's: the A/A
        control's too)."""
        if self.serving is not None:
            return self.serving.cells()
        return [cell for cell in self.grid() if cell in self._samples]

    def samples(self, mode: str, length: int) -> dict[int, float]:
        """{repetition index: seconds} of one cell (empty when it never ran)."""
        return dict(self._samples.get((mode, length), {}))

    def seconds(self, mode: str, length: int) -> list[float]:
        return list(self._samples.get((mode, length), {}).values())

    def estimation(self, length: int) -> dict:
        """How this length's speedups were estimated (kvbench.measure.estimation): its clock, estimator and why."""
        return self._estimation.get(length) or estimation.fixed(length, self.estimator).to_dict()

    def speedup_samples(self, mode: str, length: int) -> dict[int, float]:
        """{repetition: seconds} of one cell on the clock its length's speedups are estimated on."""
        return self.samples_on(self.estimation(length)["clock"], mode, length)

    def samples_on(self, clock: str, mode: str, length: int) -> dict[int, float]:
        """{repetition: seconds} of one cell on a clock of kvbench.measure.estimation.CLOCKS (wall time where a sample
        has no reading of that clock)."""
        if clock == "wall":
            return self.samples(mode, length)
        if clock not in self._clocked:
            self._clocked[clock] = estimation.series(self.record["repetitions"], clock)
        return dict(self._clocked[clock].get((mode, length), {}))

    def check(self, mode: str, length: int) -> dict | None:
        return self._checks.get((mode, length))

    def memory(self, mode: str, length: int) -> dict | None:
        return self._memory.get((mode, length))

    def summary(self, mode: str, length: int) -> dict | None:
        return self._summaries.get((mode, length))

    def speedup(self, mode: str, length: int) -> dict | None:
        return self._speedups.get((mode, length))

    def repetitions(self, mode: str, length: int) -> list[dict]:
        """The raw repetitions of one cell (with their telemetry), in the order run."""
        return list(self._repetitions.get((mode, length), []))

    def every_repetition(self) -> list[Repetition]:
        """Every timed sample of the run, A/A control's included, in the record's order."""
        return [Repetition.from_dict(rep) for rep in self.record["repetitions"]]

    def latency(self, mode: str, length: int) -> dict | None:
        """A request run's latency figures of one cell (kvbench.measure.latency.mode_latency, with its TTFT and TPOT
        ratios to the baseline under "ratios"); None for any other run, or a cell it never timed."""
        return self._latency.get((mode, length))

    def quantized_positions(self, mode: str, length: int) -> int | None:
        """Positions a quantized kind held quantized at the end of its loop at `length` (kvbench.modes
        .quantized_positions): as its cache counted them, else by kvbench's own kinds' rule; None where it
        quantizes nothing by design or the record cannot tell."""
        recorded = (self.memory(mode, length) or {}).get("quantized_positions")
        return modes.quantized_positions(mode, length, recorded, **self.cache_options(mode))

    def cache_options(self, mode: str) -> dict:
        """The options the run gave this mode's cache (kvbench.modes): empty for a mode without any."""
        return dict(self.run["cache_options"].get(mode, {}))

    def planned(self, length: int) -> int:
        """Rotations a complete run made at this length (run.repeats under the fixed protocol)."""
        entry = self._sampling.get(length)
        return entry["rotations"] if entry and entry["stop"] != "interrupted" else self.planned_repeats

    def length_sampling(self, length: int) -> dict | None:
        """How many rotations this length ran, why it stopped, how precise it got (None: a length never run)."""
        return self._sampling.get(length)

    def probe_seconds(self, call: str) -> list[float]:
        """Every timed call of one machine-probe call, both phases (empty without a probe)."""
        probe = self.machine_probe or {}  # its end phase is absent when the run was cut short
        return [s for phase in ("start", "end") for s in probe.get(phase, {}).get(call, [])]

    def passed(self, mode: str, length: int) -> bool:
        check = self.check(mode, length)
        return bool(check and check["passed"])


class ServingView:
    """A serving record's own parts (kvbench.record.serving), for every reader of one: its trace, its KV budget,
    each kind's settings and check, its cells (CellKey(mode, trace=..., budget=...), one per kind and the A/A
    control's), every kept replay and the figures derived from their stamps (kvbench.serving.figures)."""

    def __init__(self, record: dict) -> None:
        section = record["serving"]
        self.trace: dict = section["trace"]  # kvbench.serving.trace's form: spec, arrivals, requests
        self.budget: dict = section["budget"]  # bytes, as given, the reserve policy, each kind's minimum
        self.settings: dict = section["settings"]
        self.outputs: dict = section["outputs"]
        self.sweep: dict | None = section.get("sweep")  # a rate sweep or capacity search (kvbench.serving.sweep)
        self.trace_name: str = record["run"]["workload"]["trace"]
        self.kinds: list[str] = list(record["run"]["modes"])
        self.checks: dict[str, dict] = {check["mode"]: check for check in record["checks"]}
        self.replays: list[dict] = record["repetitions"]  # each: mode, repetition, order, seconds, ..., replay
        self.rotations: dict = {entry["trace"]: entry for entry in record["sampling"]["cells"]}

    def cell(self, mode: str) -> CellKey:
        return CellKey(mode, trace=self.trace_name, budget=self.budget["bytes"])

    def cells(self) -> list[CellKey]:
        """The kinds (then the A/A control) that have at least one kept replay, in the run's order."""
        replayed = {kept["mode"] for kept in self.replays}
        return [self.cell(mode) for mode in [*self.kinds, *sorted(replayed - set(self.kinds))] if mode in replayed]

    def replays_of(self, cell: CellKey) -> dict[int, dict]:
        """{rotation: the replay's raw stamps and memory} of one cell."""
        return {kept["repetition"]: kept["replay"] for kept in self.replays if self.cell(kept["mode"]) == cell}

    def figures(self, cell: CellKey) -> dict[int, dict]:
        """{rotation: that replay's figures} (kvbench.serving.figures.replay_figures)."""
        return {rotation: replay_figures(replay) for rotation, replay in self.replays_of(cell).items()}

    def request_figures(self, cell: CellKey) -> dict[int, dict[str, list[float]]]:
        """{rotation: per-request TTFT, TPOT, E2E, queueing and every ITL} in seconds."""
        return {rotation: request_latencies(replay) for rotation, replay in self.replays_of(cell).items()}

    def check(self, cell: CellKey) -> dict | None:
        return self.checks.get(cell.mode) if cell == self.cell(cell.mode) else None
