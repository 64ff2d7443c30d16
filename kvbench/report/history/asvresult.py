"""`kvbench asv-show`: an asv result file's samples, medians and intervals beside its capture."""

from __future__ import annotations

import math
import re
from pathlib import Path

from kvbench.asvtools import AsvToolError, capture_path_for_result, load_capture
from kvbench.measure.capture import summarize_environment
from kvbench.report.history.asvfile import AsvResult, BenchmarkResult, benchmark_metadata, load_result
from kvbench.report.format import visible


def _format_value(value, unit: str) -> str:
    from asv.util import human_value

    if value is None:
        return "failed"
    if isinstance(value, float) and math.isnan(value):
        return "skipped"
    if isinstance(value, float) and math.isinf(value):
        return "unbounded"
    if unit == "seconds":
        return human_value(value, unit)
    if unit == "bytes":
        return f"{value:,.0f} B"
    return f"{value:.6g}"


def _version_text(version: str | None) -> str:
    if not version:
        return ""
    return f" version {version[:12]}" if re.fullmatch(r"[0-9a-f]{64}", version) else f" version {version}"


def show_result(path: Path | str) -> str:
    """The text of `kvbench asv-show`: environment and capture, then every benchmark. Control characters from
    the files are shown as escapes: a result file never drives the terminal it is shown on."""
    path = Path(path)
    result = load_result(path)
    meta = benchmark_metadata(path.parent.parent)
    lines = result_lines(result) + capture_lines(result)
    for name in sorted(result.benchmarks):
        lines += ["", *benchmark_lines(name, result.benchmarks[name], meta.get(name, {}))]
    return visible("\n".join(lines))


def result_lines(result: AsvResult) -> list[str]:
    """The machine, commit and environment asv recorded."""
    params = result.params
    lines = [
        f"result   {result.path}",
        f"machine  {params.get('machine')}: {params.get('cpu', '?')}, {params.get('num_cpu', '?')} cpus, "
        f"ram {params.get('ram', '?')} bytes, {params.get('os', '?')} {params.get('arch', '')}".rstrip(),
        f"commit   {result.commit_hash}",
        f"env      {result.env_name} (python {result.python})",
    ]
    requirements = result.requirements
    if requirements:
        lines.append("         requirements: " + ", ".join(f"{k}=={v}" if v else k for k, v in sorted(requirements.items())))
    if result.env_vars:
        lines.append("         env vars: " + " ".join(f"{k}={v}" for k, v in sorted(result.env_vars.items())))
    return lines


def capture_lines(result: AsvResult) -> list[str]:
    """The environment kvbench captured beside the result, or why there is none."""
    capture_path = capture_path_for_result(result.path)
    try:
        captured = load_capture(capture_path)
    except AsvToolError as error:
        return [f"capture  none: {error}"]
    env = captured["environment"]
    summary = summarize_environment(env)
    system = env.get("system") or {}
    kv = env.get("kvbench") or {}
    lines = [
        f"capture  {capture_path} (taken {env['timestamp_utc']} inside the benchmarked environment)",
        f"         python {summary['python_version']} at {(env.get('python') or {}).get('executable')}",
        f"         torch {summary['torch_version']} ({summary['torch_git_version']}), cpu capability "
        f"{summary['cpu_capability']}, threads intra {summary['intra_op_threads']} / inter {summary['inter_op_threads']}",
        f"         cpu {summary['cpu_brand']}, {summary['logical_cores']} logical cores, affinity "
        f"{system.get('cpu_affinity')}, load {system.get('load_average')}, governor {system.get('cpu_governor')}",
        f"         memory {summary['memory_total_bytes']} bytes, {summary['platform']}",
        f"         kvbench {kv.get('version')} at commit {kv.get('git_commit') or 'n/a (an installed copy)'}",
        "         env vars: " + (" ".join(f"{k}={v}" for k, v in sorted((env.get("env") or {}).items())) or "-"),
    ]
    if (captured["commit_hash"], captured["env_name"]) != (result.commit_hash, result.env_name):
        lines.append(f"         WARNING: this capture is for commit {captured['commit_hash']}, env {captured['env_name']}")
    return lines


def benchmark_lines(name: str, benchmark: BenchmarkResult, info: dict) -> list[str]:
    """One benchmark: per parameter combination, its median or value, intervals and samples."""
    unit = info.get("unit", "")
    kind = "median" if info.get("type", "time") == "time" else "value"
    lines = [f"{name} [{unit or '?'}]{_version_text(benchmark.version)}"]
    names = info.get("param_names") or [f"param{i}" for i in range(len(benchmark.params))]
    for combo, value, stat, sample in zip(benchmark.combinations, benchmark.values, benchmark.stats,
                                          benchmark.samples):
        label = ", ".join(f"{n}={v}" for n, v in zip(names, combo)) or "(no parameters)"
        row = f"  {label}: {kind} {_format_value(value, unit)}"
        if stat and value is not None:
            if "ci_99_a" in stat and "ci_99_b" in stat:
                row += f", 99% CI [{_format_value(stat['ci_99_a'], unit)}, {_format_value(stat['ci_99_b'], unit)}]"
            if "q_25" in stat and "q_75" in stat:
                row += f", IQR [{_format_value(stat['q_25'], unit)}, {_format_value(stat['q_75'], unit)}]"
            if "repeat" in stat:
                row += f", {stat['repeat']:g} sample(s)"
        lines.append(row)
        if sample:
            lines.append("    samples: " + " ".join("-" if s is None else f"{s:.6g}" for s in sample))
        elif value is not None and kind == "median":
            lines.append("    samples: not recorded (run asv with --record-samples)")
    return lines
