"""`kvbench asv-show`: an asv result file's samples, medians and intervals beside its capture."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

from kvbench.asvtools import AsvToolError, capture_path_for_result, load_capture
from kvbench.measure.capture import summarize_environment
from kvbench.report.history.asvfile import AsvResult, BenchmarkResult, benchmark_metadata, load_result
from kvbench.report.format import format_bytes, visible

INDENT = " " * 9  # where a line's text starts after its label ("result   ", "capture  ")
SECONDS = (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9))


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
        return format_bytes(value)
    return plain_number(value)


def plain_number(value: float) -> str:
    """A count as a count ("16,384", not 1.638e+04), anything else to four significant digits."""
    return f"{value:,.0f}" if float(value).is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def samples_text(samples: list, unit: str) -> str:
    """Raw samples in one scaled unit, four significant digits: seconds in the unit their median reads best in
    ("samples (ms): 20 21 19.5"), bytes as bytes are shown elsewhere."""
    kept = sorted(s for s in samples if s is not None)
    if unit == "seconds" and kept:
        name, scale = next(((name, scale) for name, scale in SECONDS if kept[len(kept) // 2] >= scale), SECONDS[-1])
        return f"samples ({name}): " + " ".join("-" if s is None else f"{s / scale:.4g}" for s in samples)
    if unit == "bytes":
        return "samples: " + ", ".join("-" if s is None else format_bytes(s) for s in samples)
    return "samples: " + " ".join("-" if s is None else plain_number(s) for s in samples)


def number_text(value, unit: str = "") -> str:
    """A machine's fact as people read it: bytes scaled ("23.5 GiB"), a load average to two decimals."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return format_bytes(number) if unit == "bytes" else f"{number:.2f}"


def fit(lines: list[str], width: int | None) -> list[str]:
    """Each line wrapped to `width` at spaces, continued under its text (INDENT); a path or a number is never
    cut, so a word longer than the width runs past it whole."""
    if not width:
        return lines
    out = []
    for line in lines:
        lead = line[: len(line) - len(line.lstrip())]
        indent = INDENT if len(lead) < len(INDENT) else lead + "  "
        out += textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                             break_on_hyphens=False) or [line]
    return out


def _version_text(version: str | None) -> str:
    if not version:
        return ""
    return f" version {version[:12]}" if re.fullmatch(r"[0-9a-f]{64}", version) else f" version {version}"


def show_result(path: Path | str, width: int | None = None) -> str:
    """The text of `kvbench asv-show`: environment and capture, then every benchmark, each line wrapped to
    `width` (None: as long as it is). Control characters from the files are shown as escapes: a result file
    never drives the terminal it is shown on."""
    path = Path(path)
    result = load_result(path)
    meta = benchmark_metadata(path.parent.parent)
    lines = result_lines(result) + capture_lines(result)
    for name in sorted(result.benchmarks):
        lines += ["", *benchmark_lines(name, result.benchmarks[name], meta.get(name, {}))]
    return visible("\n".join(fit(lines, width)))


def result_lines(result: AsvResult) -> list[str]:
    """The machine, commit and environment asv recorded."""
    params = result.params
    lines = [
        f"result   {result.path}",
        f"machine  {params.get('machine')}: {params.get('cpu', '?')}, {params.get('num_cpu', '?')} cpus, "
        f"ram {number_text(params.get('ram', '?'), 'bytes')}, {params.get('os', '?')} {params.get('arch', '')}".rstrip(),
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
        f"{system.get('cpu_affinity')}, load {load_text(system.get('load_average'))}, governor "
        f"{system.get('cpu_governor')}",
        f"         memory {number_text(summary['memory_total_bytes'], 'bytes')}, {summary['platform']}",
        f"         kvbench {kv.get('version')} at commit {kv.get('git_commit') or 'n/a (an installed copy)'}",
        "         env vars: " + (" ".join(f"{k}={v}" for k, v in sorted((env.get("env") or {}).items())) or "-"),
    ]
    if (captured["commit_hash"], captured["env_name"]) != (result.commit_hash, result.env_name):
        lines.append(f"         WARNING: this capture is for commit {captured['commit_hash']}, env {captured['env_name']}")
    return lines


def load_text(load) -> str:
    return ", ".join(number_text(value) for value in load) if isinstance(load, list) else str(load)


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
            lines.append("    " + samples_text(sample, unit))
        elif value is not None and kind == "median":
            lines.append("    samples: not recorded (run asv with --record-samples)")
    return lines
