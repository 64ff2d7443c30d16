"""A rate sweep and a capacity search (kvbench.serving.goodput's definitions): the trace's requests replayed with
Poisson arrivals at each rate, one replay per kind and rate, after one request alone has given the unloaded decode
step that relative targets are multiples of. Every replay's raw stamps are kept, as the sampled replays' are.

Each rate's trace is the run's trace with its arrivals replaced (kvbench.serving.goodput.arrivals_at: the same
unit-rate gaps over the rate), so the lengths, ids and prefixes are the ones the gate checked. The sweep's replays
are not gated again: batching and timing change, what is computed does not (kvbench.serving.scheduler: tokens are
teacher-forced).
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from kvbench.measure.clock import clock_for
from kvbench.model import Decoder
from kvbench.serving import goodput
from kvbench.serving.replay import Replay
from kvbench.serving.trace import MAX_ARRIVAL, MAX_RATE, Trace


class OverBudget(Exception):
    """The sweep's next replay would go past its time budget (--max-seconds): the sweep stops there."""


def probe_trace(trace: Trace, gaps: list[float], rate: float) -> Trace:
    """The trace's requests arriving as a Poisson process at `rate` (closed-loop clients become open arrivals)."""
    arrivals = goodput.arrivals_at(gaps, rate)
    requests = tuple(replace(request, arrival=arrival, client=None)
                     for request, arrival in zip(trace.requests, arrivals))
    return Trace(requests, "poisson", None, trace.seed, {**trace.spec, "arrivals": "poisson", "rate": rate})


def unloaded_request(trace: Trace) -> Trace:
    """The request of median output length (the first such), alone, arriving at 0 and never cancelled."""
    by_output = sorted(trace.requests, key=lambda request: (request.output, request.id))
    chosen = by_output[(len(by_output) - 1) // 2]
    alone = replace(chosen, id=0, arrival=0.0, client=None, cancel_after=None)
    return Trace((alone,), "all", None, trace.seed, {**trace.spec, "arrivals": "all", "requests": 1})


def unloaded_step(model: Decoder, trace: Trace, kind: str, budget: int, settings: dict,
                  repeats: int = goodput.UNLOADED_REPEATS, text=None) -> dict:
    """One request alone, `repeats` times: its gaps between tokens (each a decode step of a batch of one) and
    their median, the unloaded decode step."""
    alone = unloaded_request(trace)
    gaps = []
    for _ in range(repeats):
        replay = Replay(model, alone, kind, budget, settings, text=text)
        replay.prepare()
        replay()
        times = replay.last["requests"][0]["token_times"]
        gaps += [later - earlier for earlier, later in zip(times, times[1:])]
    if not gaps:
        raise ValueError(f"the unloaded step needs a request of 2 or more output tokens, got "
                         f"{alone.requests[0].output}")
    request = alone.requests[0]
    return {"kind": kind, "prompt": request.prompt, "output": request.output, "repeats": repeats,
            "gaps": gaps, "step_seconds": statistics.median(gaps)}


class Sweep:
    """The replays of one sweep, kept in the order they ran; `seconds_each` (kind -> seconds) is the estimate of
    one replay that the time budget is checked against before each one."""

    def __init__(self, model: Decoder, trace: Trace, budget: int, settings: dict[str, dict],
                 max_seconds: float | None, seconds_each: dict[str, float], on_progress=None, text=None) -> None:
        self.model, self.trace, self.budget, self.settings, self.text = model, trace, budget, settings, text
        self.max_seconds, self.seconds_each, self.on_progress = max_seconds, seconds_each, on_progress
        self.gaps = goodput.unit_gaps(trace.seed, len(trace.requests))
        self.points: list[dict] = []
        self.clock = clock_for(model.device)  # a replay's seconds on the clock its stamps are on
        self.started = self.clock.now_ns()

    def replay(self, kind: str, rate: float, search: bool) -> dict:
        elapsed = (self.clock.now_ns() - self.started) / 1e9
        if self.max_seconds is not None and elapsed + self.seconds_each[kind] > self.max_seconds:
            raise OverBudget(f"stopped after {len(self.points)} replays and {elapsed:.0f} s: the next ({kind} at "
                             f"{rate:.4g}/s, about {self.seconds_each[kind]:.1f} s) would pass --max-seconds "
                             f"{self.max_seconds:g}")
        runner = Replay(self.model, probe_trace(self.trace, self.gaps, rate), kind, self.budget, self.settings[kind],
                        text=self.text)
        runner.prepare()
        began = self.clock.now_ns()
        runner()
        seconds = (self.clock.now_ns() - began) / 1e9
        self.points.append({"kind": kind, "rate": rate, "search": search, "seconds": seconds, "replay": runner.last})
        if self.on_progress is not None:
            self.on_progress(len(self.points), None, f"sweep {len(self.points)}: {kind} at {rate:.4g}/s")
        return runner.last


def run_sweep(model: Decoder, trace: Trace, kinds: list[str], budget: int, settings: dict[str, dict], *,
              rates: tuple[float, ...], targets: tuple[goodput.Target, ...], search_starts: dict[str, float],
              max_seconds: float | None, seconds_each: dict[str, float], on_progress=None,
              refused: str | None = None, text=None) -> dict:
    """The record's sweep section: the targets, the unloaded step, every replay (each rate of `rates` for each
    kind, then each kind's capacity search from its start in `search_starts`), the searches, and why it stopped
    early if it did (the time budget; `refused`: why the caller's estimate ran none of its replays)."""
    unloaded = unloaded_step(model, trace, kinds[0], budget, settings[kinds[0]], text=text)
    limits = {target.name: target.seconds(unloaded["step_seconds"]) for target in targets}
    sweep = Sweep(model, trace, budget, settings, max_seconds, seconds_each, on_progress, text)
    searches, stopped = {}, refused
    try:
        for rate in rates:
            for kind in kinds:
                sweep.replay(kind, rate, search=False)
        for kind, start in search_starts.items():
            def probe(rate: float, kind: str = kind) -> bool:
                try:
                    return goodput.attainment(sweep.replay(kind, rate, search=True), limits)["meets"]
                except OverBudget as error:
                    raise StopIteration(str(error)) from None
            found = goodput.capacity_search(probe, start, max_rate=MAX_RATE, min_rate=len(trace.requests) / MAX_ARRIVAL)
            searches[kind] = {"start": start, **found.to_dict()}
            if searches[kind]["reason"].startswith("stopped"):
                stopped = searches[kind]["reason"]
                break
    except OverBudget as error:
        stopped = str(error)
    return {"targets": [target.to_dict() for target in targets], "limits": limits, "attainment": goodput.ATTAINMENT,
            "rates": list(rates), "kinds": list(kinds), "unloaded": unloaded, "points": sweep.points,
            "searches": searches, "stopped": stopped, "max_seconds": max_seconds,
            "estimate": {"seconds_each": seconds_each,
                         "from": "each kind's median sampled replay of the trace (arrivals all) in this run"}}
