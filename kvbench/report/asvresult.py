"""`kvbench asv-show`: an asv result file's samples, medians and intervals beside its capture."""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path

from kvbench.asvtools import ASV_METADATA_FILES, AsvToolError, capture_path_for_result, load_capture, read_json_file
from kvbench.capture import summarize_environment


def load_result(path: Path | str):
    """(raw JSON, asv's Results) for a result file, read with asv's own reader.

    AsvToolError if it is missing or is not an asv result file.
    """
    from asv.results import Results

    path = Path(path)
    if path.name in ASV_METADATA_FILES:
        raise AsvToolError(f"{path}: this is asv's {path.name}, not a result file; pass results/asv/<machine>/<commit>-<env>.json")
    document = read_json_file(path, "result", finite=False)  # asv writes NaN for a skipped benchmark
    if not isinstance(document, dict) or "result_columns" not in document or "commit_hash" not in document:
        raise AsvToolError(f"{path}: not an asv result file (no commit_hash and result_columns)")
    try:
        return document, Results.load(str(path))
    except Exception as error:  # noqa: BLE001 - asv raises UserError, KeyError, TypeError ...
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise AsvToolError(f"{path}: cannot load asv result: {message}") from None


def benchmark_metadata(results_dir: Path) -> dict:
    """benchmarks.json at the results root: units, types and parameter names (may be absent)."""
    try:
        data = json.loads((Path(results_dir) / "benchmarks.json").read_text())
    except (OSError, ValueError):
        return {}
    return {name: meta for name, meta in data.items() if isinstance(meta, dict)} if isinstance(data, dict) else {}


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
    """The text of `kvbench asv-show`: environment and capture, then every benchmark."""
    path = Path(path)
    document, results = load_result(path)
    meta = benchmark_metadata(path.parent.parent)
    lines = result_lines(path, document, results) + capture_lines(path, results)
    for name in sorted(results.get_all_result_keys()):
        lines += ["", *benchmark_lines(results, name, meta.get(name, {}))]
    return "\n".join(lines)


def result_lines(path: Path, document: dict, results) -> list[str]:
    """The machine, commit and environment asv recorded."""
    params = results.params
    lines = [
        f"result   {path}",
        f"machine  {params.get('machine')}: {params.get('cpu', '?')}, {params.get('num_cpu', '?')} cpus, "
        f"ram {params.get('ram', '?')} bytes, {params.get('os', '?')} {params.get('arch', '')}".rstrip(),
        f"commit   {results.commit_hash}",
        f"env      {results.env_name} (python {document.get('python')})",
    ]
    requirements = document.get("requirements") or {}
    if requirements:
        lines.append("         requirements: " + ", ".join(f"{k}=={v}" if v else k for k, v in sorted(requirements.items())))
    if results.env_vars:
        lines.append("         env vars: " + " ".join(f"{k}={v}" for k, v in sorted(results.env_vars.items())))
    return lines


def capture_lines(path: Path, results) -> list[str]:
    """The environment kvbench captured beside the result, or why there is none."""
    capture_path = capture_path_for_result(path)
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
    if (captured["commit_hash"], captured["env_name"]) != (results.commit_hash, results.env_name):
        lines.append(f"         WARNING: this capture is for commit {captured['commit_hash']}, env {captured['env_name']}")
    return lines


def benchmark_lines(results, name: str, info: dict) -> list[str]:
    """One benchmark: per parameter combination, its median or value, intervals and samples."""
    unit = info.get("unit", "")
    kind = "median" if info.get("type", "time") == "time" else "value"
    lines = [f"{name} [{unit or '?'}]{_version_text(results.benchmark_version.get(name))}"]
    param_values = results.get_result_params(name) or []
    names = info.get("param_names") or [f"param{i}" for i in range(len(param_values))]
    combos = list(itertools.product(*param_values))  # [()] without parameters
    # One entry per parameter combination (a single one without parameters).
    values = results.get_result_value(name, param_values)
    stats = results.get_result_stats(name, param_values)
    samples = results.get_result_samples(name, param_values)
    for combo, value, stat, sample in zip(combos, values, stats, samples):
        label = ", ".join(f"{n}={v}" for n, v in zip(names, combo)) or "(no parameters)"
        row = f"  {label}: {kind} {_format_value(value, unit)}"
        if stat and value is not None:
            if "ci_99_a" in stat and "ci_99_b" in stat:
                row += f", 99% CI [{_format_value(stat['ci_99_a'], unit)}, {_format_value(stat['ci_99_b'], unit)}]"
            if "q_25" in stat and "q_75" in stat:
                row += f", IQR [{_format_value(stat['q_25'], unit)}, {_format_value(stat['q_75'], unit)}]"
            if "repeat" in stat:
                row += f", {stat['repeat']} sample(s)"
        lines.append(row)
        if sample:
            lines.append("    samples: " + " ".join("-" if s is None else f"{s:.6g}" for s in sample))
        elif value is not None and kind == "median":
            lines.append("    samples: not recorded (run asv with --record-samples)")
    return lines
