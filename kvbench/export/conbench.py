"""conbench: a JSON list of BenchmarkResult objects, one per cell, as `POST /api/benchmark-results` takes them.

Per cell: `stats.data` the raw seconds in the order they ran, unit `s` (conbench allows only `s`,
`ns`, `B`, `B/s` and `i/s`, so a speedup cannot be a result of its own); `tags` the case (name
`kvbench-decode`, workload (the case: kvbench.export.common.case_name), mode, length); `info` what
a sample covers, the median with its 95% rerun interval, the speedup with its interval and
validity, and a request's or contexts cell's figures; `context` what breaks a history when it
changes (Python, torch, threads, CPU capability); `machine_info` the captured machine; `github` the repository
(which the record does not know: the caller passes it) and the captured commit.

A request or contexts cell adds one result per series of per-sample values its figures summarize,
tagged `figure`: `ttft` and `tpot` (each request's, in seconds), `itl` (every step of every request,
pooled; its p50/p90/p99 in `info`), or `step` and `first_step` (each sample's), with the report's
median and its 95% interval of a median in `info`. A serving record's cell (kvbench.export.serving) adds
one result per latency series (ttft_p50 ... e2e_p99, each rotation's, in seconds) and one per throughput,
`output_tokens_per_second` and `requests_per_second` in `i/s` (conbench's unit for items per second), each
rotation's value; its waste (fraction) and preemptions (count), which no conbench unit holds, are in `info`.
"""

from __future__ import annotations

import uuid

from kvbench.export.common import Cell, Source, cell_facts

BENCHMARK_NAME = "kvbench-decode"
REPOSITORY_PREFIX = "https://github.com/"  # the only kind of repository the conbench server accepts
UNIT = "s"
RUN_REASON = "commit"
GIB = 1 << 30
NAMESPACE = uuid.UUID("6b5e0d64-7d1f-4bb8-9b2e-4c1f1c0f2a11")  # run ids are uuid5(NAMESPACE, machine + created)


def integer(value, default: int = 0) -> int:
    """conbench's machine fields are integers; an unknown one is 0, as conbench's own client sends it."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def machine_info(source: Source) -> dict:
    memory = integer(source.fact("system", "memory_total_bytes"))
    max_mhz = source.fact("system", "cpu_freq_max_mhz")
    frequency = integer(max_mhz * 1e6) if max_mhz else integer(source.fact("cpu", "hz_advertised"))
    release = str(source.fact("os", "release") or "")
    return {
        "name": source.machine,
        "architecture_name": str(source.fact("os", "machine") or ""),
        "kernel_name": release,
        "os_name": str(source.fact("os", "system") or ""),
        "os_version": release,
        "cpu_model_name": str(source.fact("cpu", "brand") or ""),
        "cpu_l1d_cache_bytes": integer(source.fact("cpu", "l1d_cache_bytes")),
        "cpu_l1i_cache_bytes": integer(source.fact("cpu", "l1i_cache_bytes")),
        "cpu_l2_cache_bytes": integer(source.fact("cpu", "l2_cache_bytes")),
        "cpu_l3_cache_bytes": integer(source.fact("cpu", "l3_cache_bytes")),
        "cpu_core_count": integer(source.fact("system", "physical_cores")),
        "cpu_thread_count": integer(source.fact("system", "logical_cores")),
        "cpu_frequency_max_hz": frequency,
        # rounded to GiB as conbench's client does, so the machine's identity survives a reboot
        "memory_bytes": round(memory / GIB) * GIB,
        "gpu_count": 0,
        "gpu_product_names": [],
    }


def context(source: Source) -> dict:
    facts = {"benchmark_language": "Python", "benchmark_language_version": source.fact("python", "version"),
             "torch_version": source.fact("torch", "version"), "cpu_capability": source.fact("torch", "cpu_capability"),
             "intra_op_threads": source.fact("torch", "intra_op_threads"),
             "inter_op_threads": source.fact("torch", "inter_op_threads")}
    return {key: str(value) for key, value in facts.items() if value is not None}


def github(source: Source, repository: str) -> dict:
    out = {"repository": repository}
    if source.commit:
        out["commit"] = source.commit
    return out


PER_SECOND = "i/s"  # conbench's unit for a count per second: a serving replay's tokens/s and requests/s


def series_data(cell: Cell, series: str | None) -> tuple[list[float], str]:
    """The values one result holds and their unit: the cell's seconds, a figure's series, or a throughput."""
    if series is None:
        return list(cell.seconds), UNIT
    if series in cell.series:
        return list(cell.series[series]), UNIT
    (quantity,) = [q for q in cell.quantities if q.name == series]
    return list(quantity.values), PER_SECOND


def result_series(cell: Cell) -> tuple[str | None, ...]:
    """Every result of a cell: its samples, each figure series, each throughput (a unit conbench has)."""
    return (None, *cell.series, *(q.name for q in cell.quantities if q.unit.endswith("/s")))


def result(cell: Cell, source: Source, repository: str, series: str | None = None) -> dict:
    """The cell's samples, or with `series` one series of its figures' per-sample values or a throughput's."""
    run_id = uuid.uuid5(NAMESPACE, f"{source.machine}\n{source.created_utc}\n{source.path}").hex
    named = {"run_name": f"{RUN_REASON}: {source.commit}"} if source.commit else {}  # as conbench's client names it
    return {
        **named,
        "run_id": run_id,
        "run_tags": {"machine": source.machine},
        "batch_id": run_id,
        "run_reason": RUN_REASON,
        "timestamp": source.created_utc.replace("Z", "+00:00"),
        "stats": dict(zip(("data", "unit"), series_data(cell, series)), iterations=1),
        # the tag keeps its first name, "workload": renaming it would start every conbench history afresh
        "tags": {"name": BENCHMARK_NAME, "workload": cell.case, "mode": cell.mode, "length": str(cell.length),
                 **({} if series is None else {"figure": series})},
        "info": {key: value for key, value in cell_facts(cell, source).items() if value is not None},
        "machine_info": machine_info(source),
        "context": context(source),
        "github": github(source, repository),
    }


def document(sources: list[Source], options: dict) -> object:
    repository = options.get("repository")
    if not repository:
        raise ValueError("conbench needs the GitHub repository the records measured (its github.repository field "
                         "is required): pass --repository https://github.com/ORG/REPO or set CONBENCH_PROJECT_REPOSITORY")
    if not repository.startswith(REPOSITORY_PREFIX):
        raise ValueError(f"conbench takes a repository URL starting with {REPOSITORY_PREFIX}, got {repository!r}")
    return [result(cell, source, repository, series) for source in sources for cell in source.cells
            for series in result_series(cell)]
