"""Per-sample noise telemetry: what, besides the code, was going on while a loop was timed.

On a shared machine the noise comes from outside the benchmark thread: another thread on
its CPU (context switches, run-queue wait), the hypervisor (steal), a CPU quota (cgroup
throttling), or a move to another CPU. Each is read before and after every sample from
counters the kernel keeps anyway, through file descriptors opened once, outside the timed
region. The machine-wide counters (steal, cgroup throttling) are the costly ones (the kernel
formats all of /proc/stat for one line), so a sample's start reuses the previous sample's end
for them: whatever happened in the few microseconds between two samples counts against the
next one, never for it. A sample's telemetry costs about 17 µs on a 2-core VM (`sample_cost`
measures it at the start of every run).

A counter this machine does not offer is None in every sample, with the reason kept once
in `Counters.unavailable`; a missing sensor never costs a measurement.
"""

from __future__ import annotations

import ctypes
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, NamedTuple

from kvbench.measure.clock import HOST, Clock

FIELDS = ("cpu_seconds", "voluntary_switches", "involuntary_switches", "runqueue_seconds", "steal_seconds",
          "throttled_seconds", "cpu_start", "cpu_end")
# A sample is disturbed when one of these says the thread did not have its CPU to itself.
DISTURBED_RUNQUEUE = 0.01  # waited for a CPU more than 1% of the sample
DISTURBED_STEAL = 0.01  # the hypervisor took more than 1% of the sample's wall time (machine-wide)
DISTURBED_OFF_CPU = 0.02  # wall time exceeds the thread's CPU time by more than 2%


class Reading(NamedTuple):
    """Raw counters at one instant; None where the source is unavailable (a tuple: cheap to build)."""

    cpu_ns: int
    voluntary: int | None
    involuntary: int | None
    runqueue_ns: int | None
    steal_ticks: int | None
    throttled_ns: int | None
    cpu: int | None


@dataclass
class Counters:
    """Opens its sources once; `read()` then costs a few system calls. The thread's CPU time is read from `clock`,
    the one the samples are timed on, so that a sample's CPU and wall seconds come from one source."""

    unavailable: dict[str, str] = field(default_factory=dict)
    clock: Clock = HOST

    def __post_init__(self) -> None:
        self._machine: tuple[int | None, int | None] | None = None  # steal, throttling at the last full reading
        self._schedstat = self._open("/proc/thread-self/schedstat", "runqueue_seconds")
        self._stat = self._open("/proc/stat", "steal_seconds")
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        throttle = cgroup_cpu_stat()
        self._cgroup = self._open(throttle, "throttled_seconds") if throttle else None
        if throttle is None:
            self.unavailable["throttled_seconds"] = "no cgroup cpu.stat with throttling counters for this process"
        self._rusage = getattr(resource, "RUSAGE_THREAD", None)
        if self._rusage is None:
            for name in ("voluntary_switches", "involuntary_switches"):
                self.unavailable[name] = "getrusage(RUSAGE_THREAD) is Linux-only"
        try:
            self._getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
            self._getcpu.restype = ctypes.c_int
        except (OSError, AttributeError):
            self._getcpu = None
            self.unavailable["cpu_start"] = self.unavailable["cpu_end"] = "sched_getcpu is not available"

    def _open(self, path: str | Path, name: str) -> int | None:
        try:
            descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            os.pread(descriptor, 4096, 0)
            return descriptor
        except OSError as error:
            self.unavailable[name] = f"{path}: {error.strerror or error}"
            return None

    def close(self) -> None:
        for descriptor in (self._schedstat, self._stat, self._cgroup):
            if descriptor is not None:
                os.close(descriptor)

    def read(self, machine_wide: bool = True, opening: bool = False) -> Reading:
        """The counters now; with `machine_wide` False, steal and throttling as of the last full reading.

        The thread's CPU clock is read last in an `opening` reading and first otherwise, so that the
        CPU time of a sample never includes the cost of reading the other counters, which the wall
        clock between the two readings does not see either.
        """
        cpu_ns = None if opening else self.clock.cpu_ns()
        usage = resource.getrusage(self._rusage) if self._rusage is not None else None
        if machine_wide or self._machine is None:
            self._machine = (_steal(self._stat), _throttled(self._cgroup))
        cpu = self._getcpu() if self._getcpu is not None else None
        runqueue_ns = _schedstat_wait(self._schedstat)
        return Reading(
            cpu_ns=self.clock.cpu_ns() if opening else cpu_ns,
            voluntary=usage.ru_nvcsw if usage else None,
            involuntary=usage.ru_nivcsw if usage else None,
            runqueue_ns=runqueue_ns,
            steal_ticks=self._machine[0],
            throttled_ns=self._machine[1],
            cpu=cpu,
        )

    def difference(self, start: Reading, end: Reading) -> dict:
        """The sample's telemetry: what happened between two readings."""
        return {
            "cpu_seconds": (end.cpu_ns - start.cpu_ns) / 1e9,
            "voluntary_switches": _delta(start.voluntary, end.voluntary),
            "involuntary_switches": _delta(start.involuntary, end.involuntary),
            "runqueue_seconds": _scaled(_delta(start.runqueue_ns, end.runqueue_ns), 1e-9),
            "steal_seconds": _scaled(_delta(start.steal_ticks, end.steal_ticks), 1 / self._ticks),
            "throttled_seconds": _scaled(_delta(start.throttled_ns, end.throttled_ns), 1e-9),
            "cpu_start": start.cpu,
            "cpu_end": end.cpu,
        }


def _delta(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else b - a


def _scaled(value: int | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _schedstat_wait(descriptor: int | None) -> int | None:
    """/proc/thread-self/schedstat: "on-CPU ns, run-queue wait ns, timeslices"."""
    if descriptor is None:
        return None
    return int(os.pread(descriptor, 128, 0).split()[1])


def _steal(descriptor: int | None) -> int | None:
    """/proc/stat's first line: cpu user nice system idle iowait irq softirq steal (clock ticks)."""
    if descriptor is None:
        return None
    fields = os.pread(descriptor, 256, 0).split(b"\n", 1)[0].split()
    return int(fields[8]) if len(fields) > 8 else None


def _throttled(descriptor: int | None) -> int | None:
    """cgroup cpu.stat: v1 `throttled_time` in ns, v2 `throttled_usec`."""
    if descriptor is None:
        return None
    for line in os.pread(descriptor, 4096, 0).splitlines():
        name, _, value = line.partition(b" ")
        if name == b"throttled_time":
            return int(value)
        if name == b"throttled_usec":
            return int(value) * 1000
    return None


def cgroup_directories(controller: str, root: str = "/sys/fs/cgroup",
                       membership: str = "/proc/self/cgroup") -> list[Path]:
    """Where this process's cgroup keeps `controller`'s files (v2 unified, or the v1 hierarchy
    holding the controller), most specific first. Inside a container the cgroup's own
    directory is usually mounted as the root, so each hierarchy's root is a candidate too."""
    try:
        lines = Path(membership).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        relative = path.lstrip("/")
        if controllers == "":
            bases = [Path(root), Path(root) / "unified"]
        elif controller in controllers.split(","):
            bases = [Path(root) / controllers]
        else:
            continue
        found += [directory for base in bases for directory in (base / relative, base)]
    return list(dict.fromkeys(found))


def cgroup_cpu_stat(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> Path | None:
    """The cpu.stat of this process's cgroup that counts throttling (v2 unified, or v1 cpu)."""
    for directory in cgroup_directories("cpu", root, membership):
        try:
            if b"throttled" in (directory / "cpu.stat").read_bytes():
                return directory / "cpu.stat"
        except OSError:
            continue
    return None


def disturbances(seconds: float, telemetry: dict) -> list[str]:
    """Why a sample was disturbed (empty when nothing says it was)."""
    reasons = []
    # An involuntary switch alone is not counted: a shared VM preempts a few times a second for
    # microseconds (a 2 s loop sees 3-6 switches and 0.1 ms of waiting). What costs a sample is the
    # time it then waits, which the run-queue and off-CPU rules below measure.
    if (telemetry.get("runqueue_seconds") or 0) > DISTURBED_RUNQUEUE * seconds:
        reasons.append("waited for a CPU")
    if (telemetry.get("steal_seconds") or 0) > DISTURBED_STEAL * seconds:
        reasons.append("steal")
    if telemetry.get("throttled_seconds"):
        reasons.append("throttled")
    if telemetry.get("cpu_start") is not None and telemetry.get("cpu_start") != telemetry.get("cpu_end"):
        reasons.append("migrated")
    if telemetry.get("cpu_seconds") is not None and seconds - telemetry["cpu_seconds"] > DISTURBED_OFF_CPU * seconds:
        reasons.append("off CPU")
    return reasons


def tally(samples: Iterable[tuple[float, dict]]) -> tuple[int, dict[str, int]]:
    """(disturbed samples, reason -> how many samples it disturbed, most frequent first) over
    (seconds, telemetry) pairs."""
    disturbed, reasons = 0, {}
    for seconds, telemetry in samples:
        found = disturbances(seconds, telemetry)
        disturbed += bool(found)
        for reason in found:
            reasons[reason] = reasons.get(reason, 0) + 1
    return disturbed, dict(sorted(reasons.items(), key=lambda item: -item[1]))



def sample_cost(counters: Counters, count: int = 2000) -> float:
    """Seconds a sample's telemetry takes here: its two readings, as time_observed takes them, on the counters'
    clock."""
    now_ns = counters.clock.now_ns
    start = now_ns()
    for _ in range(count):
        counters.read(machine_wide=False)
        counters.read()
    return (now_ns() - start) / count / 1e9
