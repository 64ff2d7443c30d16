"""The typed pieces a RecordView hands its readers: a cell's key, the workload, one repetition.

Torch-free, built from a record already upgraded to the current schema and validated, so
they default nothing that the record holds: where a field is None, the record says the
run has none (a loop has no prompt; a sample of a record upgraded from schema 1 has no
telemetry).
"""

from __future__ import annotations

from dataclasses import dataclass

# the counters read around every sample since schema 2 (kvbench.measure.telemetry), with the JSON type each holds
TELEMETRY = {"cpu_seconds": "number", "voluntary_switches": "integer", "involuntary_switches": "integer",
             "runqueue_seconds": "number", "steal_seconds": "number", "throttled_seconds": "number",
             "cpu_start": "integer", "cpu_end": "integer"}


class CellKey(tuple):
    """One cell of a run: a mode at one point of its workload's grid. Frozen and hashable.

    A loop, request or contexts cell is ``CellKey(mode, length)``: a 2-tuple equal to the plain
    ``(mode, length)`` and hashed the same, so every reader that indexes cells by ``(mode, length)``
    keeps working. A serving cell is ``CellKey(mode, trace=..., budget=...)``: a 3-tuple
    ``(mode, trace, budget)`` (the trace's name, the KV budget in bytes), which can never be
    mistaken for a loop cell: unpacking it into ``mode, length`` fails, and ``length`` is None.
    """

    __slots__ = ()

    def __new__(cls, mode: str, length: int | None = None, *, trace: str | None = None,
                budget: int | None = None) -> CellKey:
        if not isinstance(mode, str) or not mode:
            raise ValueError(f"a cell's mode is a non-empty string, got {mode!r}")
        serving = trace is not None or budget is not None
        if serving == (length is not None) or (serving and (trace is None or budget is None)):
            raise ValueError("a cell is keyed by a mode and either a length or a trace and a budget, got "
                             f"length={length!r}, trace={trace!r}, budget={budget!r}")
        return super().__new__(cls, (mode, trace, budget) if serving else (mode, length))

    @classmethod
    def of(cls, entry: dict) -> CellKey:
        """The key of a record's per-cell entry (a check, a memory entry, a summary cell, a repetition)."""
        if "length" in entry:
            return cls(entry["mode"], entry["length"])
        return cls(entry["mode"], trace=entry["trace"], budget=entry["budget"])

    mode = property(lambda self: self[0], doc="the mode (or the A/A control's label)")
    length = property(lambda self: self[1] if len(self) == 2 else None,
                      doc="positions held (loop, request, contexts); None for a serving cell")
    trace = property(lambda self: self[1] if len(self) == 3 else None, doc="a serving cell's trace")
    budget = property(lambda self: self[2] if len(self) == 3 else None, doc="a serving cell's KV budget in bytes")

    def __repr__(self) -> str:
        where = f"length={self[1]!r}" if len(self) == 2 else f"trace={self[1]!r}, budget={self[2]!r}"
        return f"CellKey({self[0]!r}, {where})"

    def __getnewargs_ex__(self):  # pickling and copying rebuild it through __new__
        return ((self[0], self[1]), {}) if len(self) == 2 else ((self[0],), {"trace": self[1], "budget": self[2]})


@dataclass(frozen=True)
class Workload:
    """What one sample of the run times (kvbench.workloads): the loop, a request, or contexts.

    request: a prompt of `prompt` tokens, then `generate` tokens (TTFT, then generate - 1 steps).
    contexts: per length, a prefill, `warmup_steps` untimed steps and `timed_steps` timed ones; both
    None in a contexts record from before the timed window (one cold step, its cache's release timed).
    serving: one replay of the trace named `trace` (kvbench.record.serving.trace_name) under a KV budget.
    """

    kind: str
    prompt: int | None = None
    generate: int | None = None
    warmup_steps: int | None = None
    timed_steps: int | None = None
    trace: str | None = None

    @classmethod
    def from_dict(cls, entry: dict) -> Workload:
        return cls(entry["kind"], entry.get("prompt"), entry.get("generate"), entry.get("warmup_steps"),
                   entry.get("timed_steps"), entry.get("trace"))

    def to_dict(self) -> dict:
        """The record's own form: the kind and the parameters it has."""
        return {"kind": self.kind, **{name: value for name, value in (
            ("prompt", self.prompt), ("generate", self.generate), ("warmup_steps", self.warmup_steps),
            ("timed_steps", self.timed_steps), ("trace", self.trace)) if value is not None}}

    @property
    def is_serving(self) -> bool:
        return self.kind == "serving"

    @property
    def is_request(self) -> bool:
        return self.kind == "request"

    @property
    def timed_window(self) -> bool:
        """A contexts run that timed a window of steps (every contexts record since 2026-12-03)."""
        return self.kind == "contexts" and self.timed_steps is not None


@dataclass(frozen=True)
class Repetition:
    """One timed sample: its cell, where it ran (repetition, order in its rotation, round, start), its seconds,
    the telemetry read around it (None where a counter was unavailable, or never recorded: schema 1), and a
    request's or contexts run's per-step durations (None for a loop)."""

    cell: CellKey
    repetition: int
    order: int
    round: int
    started: float | None  # seconds since the first timed sample; None: a record upgraded from schema 1
    seconds: float
    telemetry: dict
    ttft_seconds: float | None = None
    step_seconds: tuple[float, ...] | None = None

    @classmethod
    def from_dict(cls, entry: dict) -> Repetition:
        steps = entry.get("step_seconds")
        return cls(CellKey.of(entry), entry["repetition"], entry["order"], entry["round"], entry["started"],
                   entry["seconds"], {name: entry[name] for name in TELEMETRY}, entry.get("ttft_seconds"),
                   None if steps is None else tuple(steps))

    @property
    def mode(self) -> str:
        return self.cell.mode

    @property
    def length(self) -> int | None:
        return self.cell.length


__all__ = ["CellKey", "Repetition", "TELEMETRY", "Workload"]
