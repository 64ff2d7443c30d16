"""The figures of one trace replay, from its raw per-token timestamps and per-iteration memory (torch-free:
the report reads them from a record).

Per request, kvbench.measure.latency's definitions: TTFT = first token - arrival, ITL = the gaps between its
tokens, TPOT = (last - first) / (tokens - 1), E2E = last token - arrival; and queueing = first
admission - arrival. Percentiles (p50, p90, p99) are over the requests of the replay (ITL over
every gap of every request, as vLLM pools them). Output tokens/s and requests/s are over the
makespan (replay start, every arrival at or after it, to the last token). The same replay on its thread's
CPU time (which leaves out the waits for other processes on a shared machine, as kvbench.measure.estimation
does for loops): output tokens per CPU second and TPOT on that clock (tpot_cpu). Memory is weighted by
time over iterations: used (token states stored, a shared block once), reserved (held for
requests: a reserving kind's capacities, a pool's held blocks), waste = 1 - used / reserved, and
saved (token states the requests hold beyond those stored: what prefix sharing spared).
"""

from __future__ import annotations

from kvbench.measure import latency

LATENCIES = ("ttft", "tpot", "itl", "e2e", "queueing")


def request_latencies(outcome: dict) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT, E2E, queueing and every ITL, from the raw timestamps (kvbench.measure.latency)."""
    found = {name: [] for name in LATENCIES}
    for request in outcome["requests"]:
        times = request["token_times"]
        steps = [later - earlier for earlier, later in zip(times, times[1:])]
        figures = latency.request_figures({"ttft_seconds": times[0] - request["arrival"], "step_seconds": steps})
        found["ttft"].append(figures["ttft"])
        found["e2e"].append(figures["e2e"])
        found["itl"].extend(steps)
        found["queueing"].append(request["admitted"] - request["arrival"])
        if figures["tpot"] is not None:
            found["tpot"].append(figures["tpot"])
    return found


def time_weighted(iterations: list[dict], name: str) -> float:
    """Mean of an iteration figure over the replay's time (each iteration weighs what it lasted)."""
    times = [0.0] + [it["time"] for it in iterations]
    weights = [later - earlier for earlier, later in zip(times, times[1:])]
    total = sum(weights)
    return sum(w * it[name] for w, it in zip(weights, iterations)) / total if total else 0.0


def replay_figures(outcome: dict) -> dict:
    """One replay's figures: throughput, latency percentiles, concurrency, preemptions, memory."""
    requests, iterations = outcome["requests"], outcome["iterations"]
    makespan = max(r["token_times"][-1] for r in requests)
    tokens = sum(len(r["token_times"]) for r in requests)
    timing = {
        "makespan": makespan, "output_tokens": tokens, "output_tokens_per_second": tokens / makespan,
        "requests_per_second": len(requests) / makespan,
        **{name: latency.percentiles(values) for name, values in request_latencies(outcome).items()},
    }
    if all(r.get("token_cpu_times") for r in requests):  # kvbench's scheduler: its thread's CPU time too
        cpu_makespan = max(r["token_cpu_times"][-1] for r in requests)
        steps = [(r["token_cpu_times"][-1] - r["token_cpu_times"][0]) / (len(r["token_cpu_times"]) - 1)
                 for r in requests if len(r["token_cpu_times"]) > 1]
        timing.update(cpu_makespan=cpu_makespan, output_tokens_per_cpu_second=tokens / cpu_makespan,
                      tpot_cpu=latency.percentiles(steps))
    if not iterations:  # a peer that schedules itself (kvbench.serving.peer) records tokens, not iterations or memory
        return timing
    used, reserved = time_weighted(iterations, "used"), time_weighted(iterations, "reserved")
    return {
        **timing,
        "max_concurrency": max(it["running"] for it in iterations),
        "mean_concurrency": time_weighted(iterations, "running"),
        "preemptions": sum(it["preempted"] for it in iterations), "iterations": len(iterations),
        "used_bytes": used, "reserved_bytes": reserved, "waste": 1 - used / reserved if reserved else 0.0,
        "peak_reserved_bytes": max(it["reserved"] for it in iterations),
        "saved_bytes_max": max(it["saved"] for it in iterations),
        # where the time goes: the prefill calls (recomputes after preemption included) and the decode calls
        **{name: sum(it.get(name, 0) for it in iterations) for name in ("prefill_seconds", "decode_seconds",
                                                                          "prefill_tokens")},
    }
