"""asv's files read like kvbench's records: a regular file of bounded size, and every field a reader
touches checked for its type and range before anything uses it.

asv's own reader (asv.results.Results.load) opens the path itself (a FIFO blocks it, /dev/zero fills
memory) and trusts the types it finds (a string where a list of samples belongs is a TypeError three
calls later). A results folder that several people or CI jobs push to is written by anyone, so kvbench
reads the format itself: `load_result` gives an `AsvResult` whose every field has been checked, or raises
AsvToolError with one line naming the file and the field (``results/<benchmark>/samples/0: ...``).

The format is asv's result file, API version 2 (asv/results.py): ``results`` maps a benchmark to a list
of values, one per name in ``result_columns``; asv leaves out trailing empty columns.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

from kvbench.asvtools import ASV_METADATA_FILES, AsvToolError, read_json_file

API_VERSION = 2  # asv.results.Results.api_version
SIMPLE_COLUMNS = ("result", "params", "version", "started_at", "duration", "samples", "profile")
LATEST_DATE_MS = 253_402_300_799_999  # 9999-12-31 23:59:59.999 UTC, the last date Python's datetime holds
MAX_COMBINATIONS = 100_000  # kvbench's suites have about a hundred; asv writes a value for each
LARGEST = 1e100  # no time, ratio or byte count comes near; larger values would overflow a chart's axis


@dataclass(frozen=True)
class BenchmarkResult:
    """One benchmark of one result file; every list holds one entry per parameter combination."""

    params: list[list[str]]  # asv's reprs of each parameter's values, e.g. [["'full'", "'static'"], ["64"]]
    values: list[float | None]  # None: failed; NaN: skipped
    samples: list[list[float] | None]
    stats: list[dict[str, float]]  # the stats_* columns without "stats_", e.g. {"ci_99_a": ...}
    version: str | None
    started_at: float | None  # ms since the epoch

    @property
    def combinations(self) -> list[tuple[str, ...]]:
        return list(itertools.product(*self.params))  # [()] without parameters


@dataclass(frozen=True)
class AsvResult:
    path: Path
    commit_hash: str
    date: int | None  # the commit's date, ms since the epoch
    env_name: str
    python: str | None
    params: dict[str, object]  # the machine's description: machine, cpu, num_cpu, ram, os, arch, ...
    requirements: dict[str, str | None]
    env_vars: dict[str, str]
    benchmarks: dict[str, BenchmarkResult]


class Checker:
    """Type and range checks on one file's JSON; each failure is one line naming the file and the field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, expected: str, value: object) -> AsvToolError:
        shown = repr(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return AsvToolError(f"{self.path}: {where}: expected {expected}, got {shown}")

    def text(self, value, where: str, optional: bool = False) -> str | None:
        if (value is None and optional) or isinstance(value, str):
            return value
        raise self.fail(where, "a string" + (" or null" if optional else ""), value)

    def number(self, value, where: str, optional: bool = False, finite: bool = True,
               low: float = -math.inf, high: float = math.inf) -> float | None:
        """A number (not a boolean) in [low, high]; unless `finite`, NaN and infinities too (asv's "skipped")."""
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, "a number" + (" or null" if optional else ""), value)
        if isinstance(value, float) and not math.isfinite(value):  # an int is finite, however large
            if finite:
                raise self.fail(where, "a finite number", value)
            return value
        if not low <= value <= high:
            raise self.fail(where, f"a number in [{low:g}, {high:g}]", value)
        return value

    def listed(self, value, where: str, length: int | None = None) -> list:
        if not isinstance(value, list):
            raise self.fail(where, "a list", value)
        if length is not None and len(value) != length:
            raise self.fail(where, f"{length} entries (one per parameter combination)", len(value))
        return value

    def mapping(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, "an object", value)
        return value

    def texts(self, value, where: str, values_optional: bool = False) -> dict:
        """An object of strings to strings (or null), such as requirements or environment variables."""
        for key, item in self.mapping(value, where).items():
            self.text(item, f"{where}/{key}", optional=values_optional)
        return value


def load_result(path: Path | str) -> AsvResult:
    """One asv result file, every field kvbench reads checked; AsvToolError naming the file and field."""
    path = Path(path)
    if path.name in ASV_METADATA_FILES:
        raise AsvToolError(f"{path}: this is asv's {path.name}, not a result file; pass "
                           "results/asv/<machine>/<commit>-<env>.json")
    document = read_json_file(path, "result", finite=False)  # asv writes NaN for a skipped benchmark
    if not isinstance(document, dict) or "result_columns" not in document or "commit_hash" not in document:
        raise AsvToolError(f"{path}: not an asv result file (no commit_hash and result_columns)")
    check = Checker(path)
    for key in ("params", "requirements", "commit_hash", "date", "python", "env_name", "results", "version"):
        if key not in document:
            raise AsvToolError(f"{path}: cannot load asv result: missing key {key!r}")
    if document["version"] != API_VERSION:
        raise check.fail("version", f"asv's result format {API_VERSION}", document["version"])
    params = check.mapping(document["params"], "params")
    for key, value in params.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            raise check.fail(f"params/{key}", "a string or a number", value)
    return AsvResult(
        path=path,
        commit_hash=check.text(document["commit_hash"], "commit_hash"),
        date=check.number(document["date"], "date", optional=True, low=0, high=LATEST_DATE_MS),
        env_name=check.text(document["env_name"], "env_name"),
        python=check.text(document["python"], "python", optional=True),
        params=params,
        requirements=check.texts(document["requirements"], "requirements", values_optional=True),
        env_vars=check.texts(document.get("env_vars", {}), "env_vars"),
        benchmarks=benchmark_results(check, document["result_columns"], document["results"]),
    )


def benchmark_results(check: Checker, columns, results) -> dict[str, BenchmarkResult]:
    columns = check.listed(columns, "result_columns")
    for index, column in enumerate(columns):
        if not (isinstance(column, str) and (column in SIMPLE_COLUMNS or column.startswith("stats_"))):
            raise check.fail(f"result_columns/{index}", f"one of {', '.join(SIMPLE_COLUMNS)} or stats_*", column)
    return {check.text(name, "results (a benchmark name)"): benchmark_result(check, f"results/{name}", columns, entry)
            for name, entry in check.mapping(results, "results").items()}


def benchmark_result(check: Checker, where: str, columns: list[str], entry) -> BenchmarkResult:
    entry = check.listed(entry, where)
    if len(entry) > len(columns):
        raise check.fail(where, f"at most {len(columns)} entries (one per result column)", len(entry))
    raw = dict(zip(columns, entry))
    params = check.listed(raw.get("params") or [], f"{where}/params")
    for i, values in enumerate(params):
        for j, value in enumerate(check.listed(values, f"{where}/params/{i}")):
            check.text(value, f"{where}/params/{i}/{j}")
    count = 1
    for values in params:  # multiplied one at a time: ten thousand lists of two would overflow any report
        count *= len(values)
        if count > MAX_COMBINATIONS:
            raise AsvToolError(f"{check.path}: {where}/params: expected at most {MAX_COMBINATIONS:,} parameter "
                               f"combinations, got more")

    def per_combination(column: str, check_one) -> list:
        value = raw.get(column)
        if value is None:  # the whole column is missing: every combination failed or kept nothing
            return [None] * count
        return [check_one(item, f"{where}/{column}/{i}") for i, item in
                enumerate(check.listed(value, f"{where}/{column}", length=count))]

    def measured(value, at: str) -> float | None:
        return check.number(value, at, optional=True, low=-LARGEST, high=LARGEST)

    def value_or_skipped(value, at: str) -> float | None:  # NaN: skipped (asv), infinity: unbounded
        return check.number(value, at, optional=True, finite=False, low=-LARGEST, high=LARGEST)

    def samples_of(value, at: str):
        if value is None:
            return None
        return [measured(s, f"{at}/{k}") for k, s in enumerate(check.listed(value, at))]

    stats: list[dict[str, float]] = [{} for _ in range(count)]
    for column in (c for c in columns if c.startswith("stats_")):
        for i, value in enumerate(per_combination(column, value_or_skipped)):
            if value is not None:
                stats[i][column.removeprefix("stats_")] = value
    return BenchmarkResult(
        params=params,
        values=per_combination("result", value_or_skipped),
        samples=per_combination("samples", samples_of),
        stats=stats,
        version=check.text(raw.get("version"), f"{where}/version", optional=True),
        started_at=check.number(raw.get("started_at"), f"{where}/started_at", optional=True, low=0,
                                high=LATEST_DATE_MS),
    )


def benchmark_metadata(results_dir: Path | str) -> dict[str, dict]:
    """benchmarks.json at the results root: units, types and parameter names, checked; {} if it is absent."""
    path = Path(results_dir) / "benchmarks.json"
    if not path.exists() and not path.is_symlink():
        return {}
    data = read_json_file(path, "benchmarks.json", finite=False)
    check = Checker(path)
    meta = {}
    for name, info in check.mapping(data, "(top level)").items():
        if name == "version":
            continue
        info = check.mapping(info, name)
        for key in ("unit", "type"):
            check.text(info.get(key, ""), f"{name}/{key}")
        for i, value in enumerate(check.listed(info.get("param_names", []), f"{name}/param_names")):
            check.text(value, f"{name}/param_names/{i}")
        meta[name] = info
    return meta
