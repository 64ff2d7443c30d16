"""The machine probe's calls and the environment capture as cheap stand-ins, for a `kvbench run` in a test.

Each real `kvbench run` paid about 4 s of wall time and 0.7 s of CPU for them (a 32 MiB copy, a 200,000-step Python
loop, five git processes). conftest's autouse fixture installs these in the test process; a test that starts
kvbench in a child process runs `CHILD` there first. The probe's timing code still runs
(kvbench.measure.machine.probe_phase) on calls of the same names, and the capture is the canned environment below,
which record validation accepts. Nothing here imports torch, so a child that installs them starts as fast as before.
"""

from __future__ import annotations

import copy
import datetime
from pathlib import Path

ENVIRONMENT = {
    "timestamp_utc": "2026-01-01T00:00:00+00:00",
    "python": {"implementation": "CPython", "version": "3.11.7", "executable": "/venv/bin/python"},
    "torch": {"version": "2.13.0+cpu", "git_version": "cf30153c", "debug": False, "intra_op_threads": 1,
              "inter_op_threads": 1, "cpu_capability": "AVX2", "mkldnn_available": True,
              "parallel_info": "ATen/Parallel:\n\tat::get_num_threads() : 1\n\tat::get_num_interop_threads() : 1\n"},
    "cpu": {"brand": "Test CPU 9000", "arch": "X86_64", "flags": ["avx", "avx2", "fma"], "has_avx512": False},
    "system": {"logical_cores": 2, "load_average": [0.25, 0.5, 0.75], "memory_available_bytes": 8 << 30,
               "memory_total_bytes": 16 << 30, "cpu_governor": "performance"},
    "os": {"platform": "Linux-6.1-x86_64", "hostname": "bench-1"},
    "env": {},
    "kvbench": {"version": "0.1.0", "git_commit": "a" * 40, "git_dirty": False, "git_branch": "main"},
    "unavailable": {},
}


def cheap_probe_calls():
    from kvbench.measure.machine import PROBE_CALLS

    return {name: (lambda: sum(range(100))) for name in PROBE_CALLS}


def canned_environment():
    environment = copy.deepcopy(ENVIRONMENT)
    environment["timestamp_utc"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return environment


def install(capture_too: bool = True) -> None:
    """The stand-ins in this process (`capture_too` False: the real capture, for a test of it)."""
    from kvbench.measure import capture, machine

    machine.probe_calls = cheap_probe_calls
    if capture_too:
        capture.collect_environment = canned_environment


# A child's first line: this folder on its path, then install().
CHILD = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import machine_stubs; machine_stubs.install"
