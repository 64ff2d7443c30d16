"""The machine probe: fixed workloads that measure the machine, not kvbench's code.

Two runs of the same commit can differ because the machine did (a busy neighbour, a lower
clock, another VM on the host). kvbench's own loops cannot tell that apart from a change in
the code they share, so every run also times four workloads that depend on nothing of
kvbench, at its start and at its end: the interpreter (a pure-Python loop), torch's
dispatcher (many tiny ops, what a small model's decode step is made of), arithmetic (a
fixed matmul) and memory (a copy of a buffer far larger than the caches). `kvbench compare`
reads the two records' probes: when the probe moved as much as `full` did, the machine
moved, not the code.
"""

from __future__ import annotations

from typing import Callable

from kvbench.timing import time_call

REPEATS = 5  # timed calls per workload per phase, after one untimed
PHASES = ("start", "end")
MATMUL_SIZE = 384  # (384 x 384) @ (384 x 384), float32: 113 MFLOP per call
COPY_BYTES = 32 << 20  # float32 elements copied per call: past any last-level cache
DISPATCH_OPS = 4000  # tiny additions per call
PYTHON_ITERATIONS = 200_000
WORKLOADS = {
    "python": f"sum of i * i over {PYTHON_ITERATIONS:,} integers in pure Python",
    "dispatch": f"{DISPATCH_OPS:,} additions to an 8-element float32 tensor",
    "matmul": f"{MATMUL_SIZE} x {MATMUL_SIZE} float32 matmul, 3 times",
    "copy": f"copy of {COPY_BYTES >> 20} MiB of float32, 3 times",
}


def workloads() -> dict[str, Callable[[], object]]:
    """name -> one call of that workload (its tensors built once, outside the timed calls)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, generator=generator)
    source, target = torch.ones(COPY_BYTES // 4), torch.empty(COPY_BYTES // 4)
    tiny = torch.zeros(8)
    return {
        "python": lambda: sum(i * i for i in range(PYTHON_ITERATIONS)),
        "dispatch": lambda: [tiny.add(1.0) for _ in range(DISPATCH_OPS)],
        "matmul": lambda: [torch.mm(a, b) for _ in range(3)],
        "copy": lambda: [target.copy_(source) for _ in range(3)],
    }


def probe_phase(calls: dict[str, Callable[[], object]], repeats: int = REPEATS) -> dict[str, list[float]]:
    """Seconds of each workload, `repeats` times after one untimed call, workloads interleaved."""
    for call in calls.values():
        call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            seconds[name].append(time_call(call))
    return seconds
