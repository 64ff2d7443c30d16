"""What the test suite costs, test by test: a pytest plugin, and the summary of what it wrote (docs/testing.md).

Per test, in each process (each xdist worker): the CPU seconds of the process and of its waited-for children
(user + sys, getrusage), the wall seconds, when it started, and the wall seconds the garbage collector spent in it
(gc.callbacks, each collection's start to its stop). A test's module-scoped fixtures are charged to the first test
of that module on each worker. Collection is one row of its own.

    PYTHONPATH=scripts SUITE_PROFILE_DIR=/tmp/profile .venv/bin/python -m pytest -q -n 2 --dist loadgroup \\
        -p suite_profile -p no:cacheprovider
    .venv/bin/python scripts/suite_profile.py /tmp/profile [--top 30]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROWS: list[dict] = []
STATE = {"collection_started": 0.0, "gc_started": None, "gc_seconds": 0.0}


def cpu_seconds() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def count_collection(phase: str, info: dict) -> None:
    if phase == "start":
        STATE["gc_started"] = time.perf_counter()
    elif STATE["gc_started"] is not None:
        STATE["gc_seconds"] += time.perf_counter() - STATE["gc_started"]
        STATE["gc_started"] = None


def row(name: str, before: tuple, started: float, gc_before: float) -> dict:
    own, children = cpu_seconds()
    return {"test": name, "cpu": own - before[0], "children_cpu": children - before[1],
            "wall": time.perf_counter() - started, "started": time.time() - (time.perf_counter() - started),
            "gc": STATE["gc_seconds"] - gc_before}


def pytest_configure(config) -> None:
    gc.callbacks.append(count_collection)
    STATE["collection_cpu"], STATE["collection_started"] = cpu_seconds(), time.perf_counter()


def pytest_collection_finish(session) -> None:
    ROWS.append(row("<collection>", STATE["collection_cpu"], STATE["collection_started"], 0.0))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, started, gc_before = cpu_seconds(), time.perf_counter(), STATE["gc_seconds"]
    yield
    ROWS.append(row(item.nodeid, before, started, gc_before))


def pytest_unconfigure(config) -> None:
    folder = Path(os.environ.get("SUITE_PROFILE_DIR", "suite-profile"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (folder / f"{worker}.json").write_text(json.dumps(ROWS))


def summarise(rows_by_worker: dict[str, list[dict]], top: int = 30) -> str:
    """Each worker's span, CPU and collector time; CPU by test module; the `top` costliest tests."""
    lines, by_module, tests = [], defaultdict(lambda: [0.0, 0.0, 0]), []
    for worker, rows in sorted(rows_by_worker.items()):
        timed = [r for r in rows if not r["test"].startswith("<")]
        if not timed:
            continue
        span = max(r["started"] + r["wall"] for r in timed) - min(r["started"] for r in timed)
        cpu = sum(r["cpu"] + r["children_cpu"] for r in timed)
        lines.append(f"{worker}: {len(timed)} tests, {span:.1f} s from the first to the end of the last, "
                     f"{cpu:.1f} s of CPU in tests, {sum(r['gc'] for r in rows):.1f} s in the collector")
        for r in timed:
            module = by_module[r["test"].split("::")[0]]
            module[0] += r["cpu"] + r["children_cpu"]
            module[1] += r["children_cpu"]
            module[2] += 1
            tests.append((r["cpu"] + r["children_cpu"], r["children_cpu"], r["gc"], worker, r["test"]))
    lines.append("CPU by module (of it in child processes):")
    for module, (cpu, children, count) in sorted(by_module.items(), key=lambda item: -item[1][0])[:top]:
        lines.append(f"  {cpu:7.1f} s ({children:6.1f} s)  {count:5d} tests  {module}")
    lines.append("costliest tests (CPU, of it in children, in the collector):")
    for cpu, children, collector, worker, test in sorted(tests, reverse=True)[:top]:
        lines.append(f"  {cpu:6.2f} s ({children:5.2f} s, {collector:5.2f} s)  {worker}  {test}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="SUITE_PROFILE_DIR of the profiled run")
    parser.add_argument("--top", type=int, default=30, help="modules and tests listed (default 30)")
    args = parser.parse_args(argv)
    files = sorted(args.folder.glob("*.json"))
    if not files:
        parser.exit(2, f"suite_profile: no profile in {args.folder}: run pytest with -p suite_profile first\n")
    print(summarise({file.stem: json.loads(file.read_text()) for file in files}, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
