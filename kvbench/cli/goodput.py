"""`kvbench run --trace ... --rate-sweep R1,R2 | --capacity --slo ...`: the options checked torch-free with the rest
of a serving run's (kvbench.cli.serve.check_serving), then the sweep run after the sampled replays
(kvbench.serving.sweep), its time estimated from them."""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from kvbench.cli.parser import CliError
from kvbench.serving import admission, goodput, trace


@dataclass(frozen=True)
class SweepPlan:
    rates: tuple[float, ...]
    targets: tuple[goodput.Target, ...]
    capacity: bool
    max_seconds: float | None


def check_sweep(args: argparse.Namespace, kinds: list[str], served: trace.Trace) -> SweepPlan | None:
    """The sweep the options ask for, or None; every refusal one line (CliError)."""
    if not (args.rate_sweep or args.capacity):
        return None
    asked = "--rate-sweep" if args.rate_sweep else "--capacity"
    if "--arrivals" in args.given:
        raise CliError(f"{asked} replays Poisson arrivals at each rate it runs: leave out --arrivals "
                       f"(given {args.arrivals!r})")
    if admission.PEER in kinds:
        raise CliError(f"{asked}: the sweep replays kvbench's own kinds; leave {admission.PEER} out of --modes")
    try:
        rates = goodput.parse_rates(args.rate_sweep) if args.rate_sweep else ()
        for rate in rates:
            trace.check_rate(rate, len(served.requests))
    except ValueError as error:
        raise CliError(f"--rate-sweep {args.rate_sweep}: {error}") from None
    try:
        targets = goodput.parse_slo(args.slo) if args.slo else ()
    except ValueError as error:
        raise CliError(f"--slo {args.slo}: {error}") from None
    if args.capacity and not targets:
        raise CliError("--capacity searches for the highest rate that meets targets: give them with --slo "
                       "(e.g. ttft_p99=2000,tbt_p99=25x)")
    alone = max(1, sorted(request.output for request in served.requests)[(len(served.requests) - 1) // 2])
    if alone < 2:
        raise CliError(f"{asked}: the unloaded decode step is timed on the trace's median request, and its output "
                       f"of {alone} token has no step between tokens: expected 2 or more")
    return SweepPlan(rates, targets, args.capacity, args.max_seconds)


def replay_estimates(samples: list[dict], kinds: list[str]) -> tuple[dict[str, float], dict[str, float]]:
    """Per kind, from its sampled replays (arrivals all): the median seconds of one replay, the estimate of each
    sweep replay's time, and the median requests/s, where a capacity search starts."""
    from kvbench.serving.figures import replay_figures

    seconds, rates = {}, {}
    for kind in kinds:
        kept = [sample for sample in samples if sample["mode"] == kind and sample.get("replay")]
        if kept:
            seconds[kind] = statistics.median(sample["seconds"] for sample in kept)
            rates[kind] = statistics.median(replay_figures(sample["replay"])["requests_per_second"] for sample in kept)
    return seconds, rates


def run_planned(plan: SweepPlan, model, served: trace.Trace, budget: int, settings: dict, checks: dict,
                samples: list[dict], on_progress=None, text=None) -> dict | None:
    """The sweep over the kinds that passed their gate and were replayed; its estimate first: when the rates,
    then MAX_PROBES per searched kind, at each kind's sampled replay time, would pass --max-seconds, the sweep is
    refused before its first replay (its `stopped` says why)."""
    from kvbench.serving.sweep import run_sweep

    kinds = [kind for kind in checks if checks[kind]["passed"]]
    seconds, rates = replay_estimates(samples, kinds)
    kinds = [kind for kind in kinds if kind in seconds]
    if not kinds:
        return None
    planned = {kind: len(plan.rates) + (goodput.MAX_PROBES if plan.capacity else 0) for kind in kinds}
    estimate = sum(planned[kind] * seconds[kind] for kind in kinds)
    refuse = None
    if plan.max_seconds is not None and estimate > plan.max_seconds:
        refuse = (f"refused before its first replay: {sum(planned.values())} replays "
                  f"({len(plan.rates)} rates{f' and up to {goodput.MAX_PROBES} probes' if plan.capacity else ''} "
                  f"per kind) at about {', '.join(f'{seconds[k]:.1f} s' for k in kinds)} each (the sampled "
                  f"replays' median) need about {estimate:.0f} s, beyond --max-seconds {plan.max_seconds:g}")
    return run_sweep(model, served, kinds, budget, settings, rates=() if refuse else plan.rates,
                     targets=plan.targets, search_starts={} if refuse or not plan.capacity else rates,
                     max_seconds=plan.max_seconds, seconds_each=seconds, on_progress=on_progress, refused=refuse,
                     text=text)
