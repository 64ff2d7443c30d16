"""The machine probe: fixed calls that measure the machine, not kvbench's code.

Two runs of the same commit can differ because the machine did (a busy neighbour, a lower
clock, another VM on the host). kvbench's own loops cannot tell that apart from a change in
the code they share, so every run also times four calls that depend on nothing of
kvbench, at its start and at its end: the interpreter (a pure-Python loop), torch's
dispatcher (many tiny ops, what a small model's decode step is made of), arithmetic (a
fixed matmul) and memory (a copy of a buffer far larger than the caches). `kvbench compare`
reads the two records' probes: when the probe moved as much as `full` did, the machine
moved, not the code.
"""

from __future__ import annotations

from typing import Callable

from kvbench.measure.clock import clock_for
from kvbench.measure.timing import heap_frozen, time_call

REPEATS = 5  # timed calls of each probe call per phase, after one untimed
MATMUL_SIZE = 384  # (384 x 384) @ (384 x 384), float32: 113 MFLOP per call
COPY_BYTES = 32 << 20  # float32 elements copied per call: past any last-level cache
DISPATCH_OPS = 4000  # tiny additions per call
PYTHON_ITERATIONS = 200_000
# name -> what one call does. A record keeps it under machine_probe.workloads: that key predates "workload"
# meaning a loop, a request or contexts, and stays so that every record written since loads.
PROBE_CALLS = {
    "python": f"sum of i * i over {PYTHON_ITERATIONS:,} integers in pure Python",
    "dispatch": f"{DISPATCH_OPS:,} additions to an 8-element float32 tensor",
    "matmul": f"{MATMUL_SIZE} x {MATMUL_SIZE} float32 matmul, 3 times",
    "copy": f"copy of {COPY_BYTES >> 20} MiB of float32, 3 times",
}


def probe_calls() -> dict[str, Callable[[], object]]:
    """name -> one probe call (its tensors built once, outside the timed calls)."""
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
    """Seconds of each probe call, `repeats` times after one untimed call, the calls interleaved."""
    for call in calls.values():
        call()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    with heap_frozen():  # the collection before each call then costs microseconds (kvbench.measure.timing)
        for _ in range(repeats):
            for name, call in calls.items():
                seconds[name].append(time_call(call))
    return seconds


# -- the machine's limits: how fast it can stream memory and multiply ------------------------

LIMIT_REPEATS = 5
MIN_BUFFER_BYTES = 64 << 20
MAX_BUFFER_BYTES = 512 << 20
STREAMS = {"copy": 2, "triad": 3}  # arrays a kernel moves, counted as STREAM counts them (no write-allocate)


def last_level_cache_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The largest unified or data cache this CPU reports (Linux sysfs), or None."""
    from pathlib import Path

    sizes = []
    for index in Path(root).glob("index*"):
        try:
            if (index / "type").read_text().strip() in ("Unified", "Data"):
                text = (index / "size").read_text().strip().upper()
                sizes.append(int(text[:-1]) * {"K": 1 << 10, "M": 1 << 20}[text[-1]] if text[-1] in "KM" else int(text))
        except (OSError, ValueError, KeyError):
            continue
    return max(sizes, default=None)


def buffer_bytes(llc: int | None) -> int:
    """Per array: four times the last-level cache, so no pass is served from it; 64 MiB to 512 MiB."""
    return min(max(4 * (llc or 32 << 20), MIN_BUFFER_BYTES), MAX_BUFFER_BYTES)


def summarize(values: list[float]) -> dict:
    ordered = sorted(values)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    return {"median": median, "min": ordered[0], "max": ordered[-1], "samples": list(values)}


def memory_bandwidth(threads: list[int], size: int, repeats: int = LIMIT_REPEATS, device: str = "cpu") -> dict:
    """{kernel: {threads: bytes per second (median, min, max, every sample)}}, copy (a = b) and triad
    (a = b + s c) over float32 arrays of `size` bytes on `device`, timed on its clock; torch's thread count
    restored after (a device's kernels do not use them: its one entry is keyed "1")."""
    import torch

    before, clock = torch.get_num_threads(), clock_for(device)
    a, b, c = (torch.full((size // 4,), value, device=device) for value in (0.0, 1.0, 1.0))  # every page touched
    kernels = {"copy": lambda: a.copy_(b), "triad": lambda: torch.add(b, c, alpha=3.0, out=a)}
    found: dict[str, dict[str, dict]] = {name: {} for name in kernels}
    try:
        for count in threads:
            torch.set_num_threads(count)
            for name, kernel in kernels.items():
                kernel()  # first touch and warm-up
                rates = [STREAMS[name] * size / time_call(kernel, clock) for _ in range(repeats)]
                found[name][str(count)] = summarize(rates)
    finally:
        torch.set_num_threads(before)
    return found


def matmul_rates(shapes: list[tuple[int, int, int]], repeats: int = LIMIT_REPEATS, device: str = "cpu",
                 dtype=None) -> list[dict]:
    """FLOP/s of (M x K) @ (K x N) products at the given shapes (float32 unless `dtype`), on torch's current
    threads, or on `device`, timed on its clock."""
    import torch

    out, clock = [], clock_for(device)
    for m, k, n in shapes:
        x, w = (torch.randn(rows, k, device=device, dtype=dtype) for rows in (m, n))
        call = lambda x=x, w=w: torch.nn.functional.linear(x, w)  # noqa: E731 - the product a layer computes
        call()
        rates = [2 * m * k * n / time_call(call, clock) for _ in range(repeats)]
        out.append({"shape": [m, k, n], "flops_per_second": summarize(rates)})
    return out


def limits(shapes: list[tuple[int, int, int]], threads: list[int], device: str = "cpu", dtype=None,
           llc: int | None = None) -> dict:
    """What this machine can do, for a record: memory bandwidth (one thread and all) and matmul throughput; on
    another device than the CPU, its own (`llc`: its last-level cache, the host's by default; `dtype`: the
    matmuls', float32 by default)."""
    llc = llc if device != "cpu" else last_level_cache_bytes()
    size = buffer_bytes(llc)
    with heap_frozen():  # the collection before each timed call then costs microseconds (kvbench.measure.timing)
        return {"last_level_cache_bytes": llc, "buffer_bytes": size, "streams": dict(STREAMS),
                "memory_bandwidth": memory_bandwidth(threads, size, device=device),
                "matmul": matmul_rates(shapes, device=device, dtype=dtype)}


# -- the same limits, at the same moments as the samples ------------------------------------

ROUND_MATMUL_CALLS = 20  # a decode step's matmuls take microseconds: timed as 20 calls in a row


class RoundLimits:
    """Copy, triad and the step's own matmul shapes, measured once at the start of every round of rotations
    (kvbench.measure.sampling), so that "% of bandwidth" divides numbers taken minutes, not an hour, apart on a
    machine whose bandwidth moves (one-thread triad moved between 5.7 and 13.6 GB/s within an hour on a
    shared VM). Each call: one copy and one triad over arrays past the last-level cache, and
    ROUND_MATMUL_CALLS products at each shape. Its tensors are built once, outside every timed call."""

    def __init__(self, shapes: list[tuple[int, int, int]], size: int, device: str = "cpu", dtype=None) -> None:
        import torch

        self.size, self.clock = size, clock_for(device)
        self.a, self.b, self.c = (torch.full((size // 4,), value, device=device) for value in (0.0, 1.0, 1.0))
        generator = torch.Generator().manual_seed(0)  # drawn on the host, then moved: the same numbers anywhere
        self.products = {(m, k, n): tuple(torch.randn(rows, k, generator=generator, dtype=dtype).to(device)
                                          for rows in (m, n)) for m, k, n in shapes}

    def __call__(self) -> dict:
        import torch

        copy = time_call(lambda: self.a.copy_(self.b), self.clock)
        triad = time_call(lambda: torch.add(self.b, self.c, alpha=3.0, out=self.a), self.clock)
        matmul = []
        for (m, k, n), (x, w) in self.products.items():
            seconds = time_call(lambda x=x, w=w: [torch.nn.functional.linear(x, w) for _ in range(ROUND_MATMUL_CALLS)],
                                self.clock)
            matmul.append({"shape": [m, k, n], "flops_per_second": ROUND_MATMUL_CALLS * 2 * m * k * n / seconds})
        return {"copy": STREAMS["copy"] * self.size / copy, "triad": STREAMS["triad"] * self.size / triad,
                "matmul": matmul}
