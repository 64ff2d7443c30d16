"""Goodput and capacity: latency targets (SLOs), the share of requests that meet them, and the search for the
highest Poisson rate at which enough do. Torch-free: the report reads the same functions from a record.

Targets (`--slo ttft_p99=500,tbt_p99=5x`): each in milliseconds, or a multiple of one unloaded decode step (a
request alone on the server, measured in the same run), as Sarathi-Serve (Agrawal et al., OSDI 2024) sets them:
P99 time between tokens within 5x (strict) or 25x (relaxed) of that step. A request meets a target when its own
figure is within it (TARGETS: its TTFT; the 99th percentile of its own gaps between tokens; its TPOT; its E2E), and
the replay's p99 over its requests is reported beside the share. A request meets the targets when it meets every
one. Goodput is the requests per second that meet every target (vLLM `bench serve --goodput`: good requests over
the replay's makespan); the capacity is the highest rate at which at least ATTAINMENT of the requests meet them
(DistServe's 90%).

Intervals: the share is a binomial proportion over the replay's requests, with its Wilson score interval
(scipy.stats.binomtest(...).proportion_ci(method="wilson")); goodput's interval is the share's times requests /
makespan (the makespan taken as measured: replay-to-replay noise in it is not in the interval).

The search (`capacity_search`) probes rates on a log scale: exponential bracketing by BRACKET_FACTOR from a start
rate until one rate meets and one fails, then bisection at the geometric mean until the failing rate is within
SPAN of the meeting one; the capacity reported is their geometric mean, within +-5% of every rate in the bracket.
From a start within BRACKET_FACTOR**3 (64x) of the capacity that takes at most MAX_PROBES (8) probes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import numpy as np

ATTAINMENT = 0.9  # DistServe: the share of requests that must meet every target
CONFIDENCE = 0.95
MAX_PROBES = 8
TOLERANCE = 0.05  # the capacity within +-5%
SPAN = (1 + TOLERANCE) ** 2  # a bracket [low, high] with high / low <= SPAN: sqrt(low * high) within +-5% of both
BRACKET_FACTOR = 4.0
MAX_RATES = 32  # --rate-sweep: rates in one run
UNLOADED_REPEATS = 3  # the unloaded request's replays: its step is the median of every gap between its tokens


def own_p99(values: list[float]) -> float | None:
    return float(np.percentile(values, 99)) if values else None


TARGETS = {  # target name -> (the per-request figure it bounds, what that is)
    "ttft_p99": (lambda figures: figures["ttft"], "time to first token"),
    "tbt_p99": (lambda figures: own_p99(figures["gaps"]), "the 99th percentile of the request's gaps between tokens"),
    "tpot_p99": (lambda figures: figures["tpot"], "time per output token after the first"),
    "e2e_p99": (lambda figures: figures["e2e"], "end-to-end latency"),
}


@dataclass(frozen=True)
class Target:
    name: str
    value: float  # milliseconds, or a multiple of the unloaded step
    relative: bool  # True: `value` times the unloaded decode step

    def seconds(self, unloaded_step: float | None) -> float:
        if not self.relative:
            return self.value / 1000
        if unloaded_step is None or not unloaded_step > 0:
            raise ValueError(f"{self.name}={self.value:g}x needs the unloaded decode step, got {unloaded_step!r}")
        return self.value * unloaded_step

    def text(self) -> str:
        return f"{self.name}={self.value:g}{'x' if self.relative else ''}"

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.value, "relative": self.relative}


def positive_finite(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number above 0, got {text!r}")
    return value


def parse_slo(text: str) -> tuple[Target, ...]:
    """'ttft_p99=500,tbt_p99=5x': each target once, in ms or as a multiple ('5x') of the unloaded decode step."""
    found: dict[str, Target] = {}
    for part in text.split(","):
        name, equals, value = part.strip().partition("=")
        if not equals:
            raise ValueError(f"a target is NAME=MS or NAME=Nx (one of {', '.join(TARGETS)}), got {part.strip()!r}")
        if name not in TARGETS:
            raise ValueError(f"unknown target {name!r}: expected one of {', '.join(TARGETS)}")
        if name in found:
            raise ValueError(f"target {name} given twice")
        relative = value.strip().lower().endswith("x")
        number = positive_finite(name, value.strip()[:-1] if relative else value.strip())
        found[name] = Target(name, number, relative)
    return tuple(found.values())


def parse_rates(text: str) -> tuple[float, ...]:
    """'0.5,1,2': distinct Poisson rates (requests/s), each finite and above 0, in ascending order."""
    rates = [positive_finite("a rate", part.strip()) for part in text.split(",")]
    if len(set(rates)) < len(rates):
        raise ValueError(f"each rate once, got {text!r}")
    if len(rates) > MAX_RATES:
        raise ValueError(f"at most {MAX_RATES} rates, got {len(rates)}")
    return tuple(sorted(rates))


def unit_gaps(seed: int, requests: int) -> list[float]:
    """Exponential gaps at 1 request/s, seeded by the trace's seed alone: every rate's arrivals are these over the
    rate (common random numbers), so a faster rate's arrivals are the same pattern compressed, and the lengths
    never change with the rate."""
    rng = random.Random(f"kvbench.sweep/{seed}")
    return [rng.expovariate(1.0) for _ in range(requests)]


def arrivals_at(gaps: list[float], rate: float) -> list[float]:
    clock, out = 0.0, []
    for gap in gaps:
        clock += gap / rate
        out.append(round(clock, 6))
    return out


def request_figures(replay: dict) -> list[dict]:
    """Each request's TTFT, gaps, TPOT and E2E (seconds) from a replay's raw stamps."""
    out = []
    for request in replay["requests"]:
        times = request["token_times"]
        gaps = [later - earlier for earlier, later in zip(times, times[1:])]
        out.append({"ttft": times[0] - request["arrival"], "gaps": gaps,
                    "tpot": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None,
                    "e2e": times[-1] - request["arrival"]})
    return out


def meets(figures: dict, limits: dict[str, float]) -> bool:
    """Every target met; a figure a request does not have (TPOT of one token) does not count against it."""
    for name, limit in limits.items():
        value = TARGETS[name][0](figures)
        if value is not None and value > limit:
            return False
    return True


def wilson(successes: int, trials: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    from scipy.stats import binomtest  # scipy costs seconds to import: only a report with targets pays

    found = binomtest(successes, trials).proportion_ci(confidence_level=confidence, method="wilson")
    return float(found.low), float(found.high)


def attainment(replay: dict, limits: dict[str, float]) -> dict:
    """The share of the replay's requests that meet every target, with its Wilson interval, and goodput (good
    requests per second of makespan) with the share's interval scaled; each target's p99 over the requests."""
    figures = request_figures(replay)
    good = sum(meets(request, limits) for request in figures)
    makespan = max(request["token_times"][-1] for request in replay["requests"])
    low, high = wilson(good, len(figures))
    per_second = len(figures) / makespan
    p99 = {name: own_p99([v for v in (TARGETS[name][0](f) for f in figures) if v is not None]) for name in limits}
    return {"good": good, "requests": len(figures), "share": good / len(figures), "share_low": low,
            "share_high": high, "goodput": good / makespan, "goodput_low": low * per_second,
            "goodput_high": high * per_second, "p99": p99, "meets": good / len(figures) >= ATTAINMENT}


@dataclass(frozen=True)
class Search:
    """A capacity search's outcome: every probe (rate, met) in order, the bracket, the capacity (None when the
    search did not bracket it: every probe met, or none did) and why it stopped."""

    probes: tuple[tuple[float, bool], ...] = ()
    low: float | None = None  # the highest rate that met the targets
    high: float | None = None  # the lowest rate above it that did not
    reason: str = ""

    @property
    def capacity(self) -> float | None:
        if self.low is None or self.high is None or self.high / self.low > SPAN * (1 + 1e-12):
            return None
        return math.sqrt(self.low * self.high)

    def to_dict(self) -> dict:
        return {"probes": [{"rate": rate, "met": met} for rate, met in self.probes], "low": self.low,
                "high": self.high, "capacity": self.capacity, "reason": self.reason}


def next_rate(search: Search, start: float) -> float | None:
    """The rate to probe next, or None when the bracket is within SPAN."""
    if not search.probes:
        return start
    if search.low is None:
        return search.high / BRACKET_FACTOR
    if search.high is None:
        return search.low * BRACKET_FACTOR
    if search.high / search.low <= SPAN:
        return None
    return math.sqrt(search.low * search.high)


def record_probe(search: Search, rate: float, met: bool) -> Search:
    """The search with one more probe: a rate that meets becomes the bracket's low end, one that fails its high
    end; an end the new probe contradicts (met at or above a failure, or the reverse) is dropped."""
    probes = (*search.probes, (rate, met))
    if met:
        high = search.high if search.high is not None and search.high > rate else None
        return replace(search, probes=probes, low=rate, high=high)
    low = search.low if search.low is not None and search.low < rate else None
    return replace(search, probes=probes, low=low, high=rate)


def capacity_search(probe, start: float, max_probes: int = MAX_PROBES, max_rate: float = 1e6,
                    min_rate: float = 0.0) -> Search:
    """The highest rate where `probe(rate)` is True, within +-5%, in at most `max_probes` calls (see the module's
    docstring). `probe(rate) -> bool` may stop the search early by raising StopIteration (a time budget)."""
    search = Search()
    while True:
        rate = next_rate(search, start)
        if rate is None:
            return replace(search, reason=f"bracketed within +-{TOLERANCE:.0%}")
        if len(search.probes) >= max_probes:
            return replace(search, reason=f"{max_probes} probes without a bracket within +-{TOLERANCE:.0%}")
        if rate > max_rate:
            return replace(search, reason=f"every probe met the targets, up to the most a trace allows "
                                          f"({max_rate:g}/s)")
        if rate < min_rate:
            return replace(search, reason=f"no probe met the targets, down to the least a trace allows "
                                          f"({min_rate:g}/s)")
        try:
            met = bool(probe(rate))
        except StopIteration as stop:
            return replace(search, reason=str(stop) or "stopped")
        search = record_probe(search, rate, met)
