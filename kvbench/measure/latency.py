"""Every figure a client sees, from the raw per-step durations a record keeps: one function per figure.

For one request of N generated tokens (step 0 the prefill, steps 1..N-1 one token each):

  TTFT    time to first token: the prefill, up to the first token's logits (step 0)
  ITL     inter-token latency: the duration of each later step (N - 1 values)
  TPOT    time per output token after the first, as vLLM defines it: (E2E - TTFT) / (N - 1)
  E2E     end to end: TTFT + the sum of the ITLs
  tokens/s  batch * N / E2E: output tokens of every sequence of the batch

Across the sampled requests of a mode: TTFT, TPOT and E2E are medians with the
order-statistic interval of a median; the ITL percentiles pool every step of every sample
(as vLLM pools them over requests); a mode's TTFT and TPOT against `full`'s are medians of
per-rotation ratios, paired as kvbench's speedups are. The report, compare and the exporters
all read these functions, so a figure means one thing everywhere.
"""

from __future__ import annotations

import statistics

import numpy as np

from kvbench.measure import stats

PERCENTILES = (50, 90, 99)  # every latency's percentiles: a mode's pooled ITLs, a serving replay's requests
ITL_PERCENTILES = PERCENTILES
RATIOS = ("ttft", "tpot")  # the figures whose ratio to full a request run is sampled until precise


def tpot(ttft_seconds: float, step_seconds: list[float]) -> float | None:
    """vLLM's TPOT: (E2E - TTFT) / (N - 1); None for a request of one token."""
    return sum(step_seconds) / len(step_seconds) if step_seconds else None


def request_figures(repetition: dict, batch: int = 1) -> dict[str, float | None]:
    """TTFT, TPOT, E2E and tokens/s of one sampled request (a record's repetition)."""
    ttft, steps = repetition["ttft_seconds"], repetition["step_seconds"]
    e2e = ttft + sum(steps)
    return {"ttft": ttft, "tpot": tpot(ttft, steps), "e2e": e2e, "tokens_per_second": batch * (len(steps) + 1) / e2e}


def percentiles(values: list[float], prefix: str = "p") -> dict[str, float]:
    """{"p50": ..., "p90": ..., "p99": ...} of `values` (numpy's linear interpolation), names prefixed; {} when empty."""
    if not values:
        return {}
    return {f"{prefix}{level}": float(value) for level, value in zip(PERCENTILES, np.percentile(values, PERCENTILES))}


def itl_percentiles(repetitions: list[dict]) -> dict[str, float]:
    """ITL percentiles over every step of every sampled request (p50, p90, p99), as "itl_p50" etc."""
    return percentiles([s for rep in repetitions for s in rep["step_seconds"]], prefix="itl_p")


def median_with_interval(values: list[float]) -> dict[str, float]:
    low, high = stats.median_interval(values)
    return {"median": statistics.median(values), "low": low, "high": high}


def mode_latency(repetitions: list[dict], batch: int = 1) -> dict:
    """One mode's figures over its sampled requests: medians with intervals, and the pooled ITL percentiles."""
    figures = [request_figures(rep, batch) for rep in repetitions]
    out = {name: median_with_interval([f[name] for f in figures if f[name] is not None])
           for name in ("ttft", "tpot", "e2e", "tokens_per_second") if any(f[name] is not None for f in figures)}
    return {**out, **itl_percentiles(repetitions), "requests": len(repetitions),
            "generated": len(repetitions[0]["step_seconds"]) + 1 if repetitions else 0}


def context_figures(repetition: dict, warmup_steps: int) -> dict[str, float]:
    """One sample of a contexts run: its steady-state step (the mean of its timed steps, as TPOT is a mean) and
    its first step after the prefill (the cold one a client sees once per prompt, not the per-token cost)."""
    timed = repetition["step_seconds"][warmup_steps:]
    return {"step": sum(timed) / len(timed), "first_step": repetition["step_seconds"][0]}


def context_latency(repetitions: list[dict], warmup_steps: int) -> dict:
    """One mode's steps at one context over its samples: medians with their intervals."""
    figures = [context_figures(rep, warmup_steps) for rep in repetitions]
    return {name: median_with_interval([f[name] for f in figures]) for name in ("step", "first_step")} | {
        "samples": len(figures)}


def figure_by_rotation(repetitions: list[dict], figure: str, batch: int = 1) -> dict[int, float]:
    return {rep["repetition"]: request_figures(rep, batch)[figure] for rep in repetitions
            if request_figures(rep, batch)[figure] is not None}


def ratio_to_baseline(baseline: list[dict], mode: list[dict], figure: str, between_run: float,
                      key: tuple = (), interval: str | None = None) -> stats.RatioEstimate | None:
    """baseline's figure / this mode's, median of per-rotation ratios, with kvbench's rerun interval
    (or `interval`, one of kvbench.measure.stats.INTERVALS)."""
    return stats.speedup(figure_by_rotation(baseline, figure), figure_by_rotation(mode, figure),
                         between_run=between_run, key=(figure, *key), interval=interval)


def achieved_bandwidth(bytes_read: int, seconds: float) -> float:
    """Bytes per second a step streamed, if it read `bytes_read` (weights plus cache) exactly once."""
    return bytes_read / seconds


def bandwidth_limit(limits: dict, threads: int) -> float | None:
    """The measured triad bandwidth (bytes/s, median) on `threads` threads, or on the most measured below it;
    where the run measured it at every round (on its own threads), the median of those: taken beside the
    samples, not before them."""
    rounds = (limits or {}).get("rounds")
    if rounds:
        return statistics.median(entry["triad"] for entry in rounds)
    triad = (limits or {}).get("memory_bandwidth", {}).get("triad", {})
    counts = sorted((int(count) for count in triad), reverse=True)
    usable = [count for count in counts if count <= threads] or counts[-1:]
    return triad[str(usable[0])]["median"] if usable else None


def compute_limit(limits: dict) -> float | None:
    """The fastest measured matmul (FLOP/s, median): the compute roof."""
    return max(matmul_rates(limits).values(), default=None)


def matmul_rates(limits: dict) -> dict[tuple[int, int, int], float]:
    """(M, K, N) -> FLOP/s (median): over the rounds where the run measured a shape at every round, else
    from the run's one measurement."""
    rates = {tuple(entry["shape"]): entry["flops_per_second"]["median"] for entry in (limits or {}).get("matmul", [])}
    by_round: dict[tuple[int, int, int], list[float]] = {}
    for entry in (limits or {}).get("rounds", []):
        for product in entry["matmul"]:
            by_round.setdefault(tuple(product["shape"]), []).append(product["flops_per_second"])
    return {**rates, **{shape: statistics.median(values) for shape, values in by_round.items()}}


def step_matmuls(config) -> list[tuple[int, int]]:
    """(K, N) of every matrix product one forward makes per row, each as often as it is made: per layer the
    q/k/v projection, the output projection and the MLP's two, then the head."""
    C, I, HD = config.width, config.intermediate_size, config.heads * config.head_dim
    qkv = HD + 2 * config.kv_heads * config.head_dim
    mlp = [(C, 2 * I), (I, C)] if config.family == "llama" else [(C, I), (I, C)]
    return [(C, qkv), (HD, C), *mlp] * config.layers + [(C, config.vocab_size)]


def matmul_floor(config, rows: int, limits: dict) -> float | None:
    """Seconds the matmuls of one forward of `rows` rows take at the rates measured at their shapes: a floor
    under the step that no attention, norm or dispatch cost is in. None if a shape was not measured."""
    rates = matmul_rates(limits)
    try:
        return sum(2 * rows * k * n / rates[(rows, k, n)] for k, n in step_matmuls(config))
    except KeyError:
        return None


def decode_step(weight_bytes: int, cache_bytes: int, config, batch: int, context: int) -> dict[str, float]:
    """What one decode step at `context` must read and compute: every weight once (embedding rows aside),
    every cached key and value once; 2 FLOPs per weight per sequence, and attention's 4 per head, head
    width and cached position (scores and the weighted sum) per layer and sequence."""
    weights = weight_bytes / config.element_bytes
    attention = 4 * config.layers * config.heads * config.head_dim * (context + 1)
    return {"bytes": weight_bytes + cache_bytes, "flops": batch * (2 * weights + attention)}


def prefill(weight_bytes: int, config, batch: int, tokens: int) -> dict[str, float]:
    """A prefill of `tokens`: the weights read once, 2 FLOPs per weight per token, and causal attention's
    2 * (scores and sum) per head, head width and visible pair per layer."""
    weights = weight_bytes / config.element_bytes
    attention = 2 * config.layers * config.heads * config.head_dim * tokens * (tokens + 1)
    return {"bytes": weight_bytes, "flops": batch * (2 * weights * tokens + attention)}
