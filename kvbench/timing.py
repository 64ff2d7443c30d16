"""The measurement protocol. Returns raw samples; statistics belong to the report.

Fixed seed, batch, model dimensions, dtype and thread count; one warmup per mode;
N repetitions whose mode order rotates so that every mode runs in every position
equally often; each sample times one whole decode loop with perf_counter_ns.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import psutil
import torch
from torch import Tensor

from kvbench.decode import FULL, cache_footprint, check_equivalence, check_modes, decode, decode_full, token_ids
from kvbench.model import Decoder

GC_POLICY = "collect before each sample, disabled while timing"


@dataclass(frozen=True)
class Sample:
    mode: str
    length: int
    repetition: int
    order: int  # position of this mode within its repetition, from 0
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Protocol:
    repeats: int = 7
    warmup: int = 1
    threads: int = 1
    gc: str = GC_POLICY
    order: str = "rotating: repetition r runs modes[r % m:] + modes[:r % m]"
    clock: str = "time.perf_counter_ns"
    threads_in_effect: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def set_threads(threads: int) -> dict:
    """Pin torch's intra- and inter-op pools; return what is actually in effect.

    The inter-op pool can be sized only before its first use in a process, so a
    late call is recorded as what it is rather than assumed to have worked.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    torch.set_num_threads(threads)
    note = None
    if torch.get_num_interop_threads() != threads:
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError as error:
            note = f"inter-op threads could not be changed: {error}"
    in_effect = {
        "requested": threads,
        "intra_op": torch.get_num_threads(),
        "inter_op": torch.get_num_interop_threads(),
    }
    if note:
        in_effect["note"] = note
    return in_effect


def mode_orders(modes: list[str], repeats: int) -> list[list[str]]:
    """A rotation per repetition: with m modes and repeats a multiple of m, each
    mode runs in each position equally often (for two modes: alternation)."""
    m = len(modes)
    return [modes[r % m :] + modes[: r % m] for r in range(repeats)]


def time_call(run: Callable[[], object]) -> float:
    """Seconds for one call, with the collector out of the timed region."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        run()
        elapsed = time.perf_counter_ns() - start
    finally:
        if enabled:
            gc.enable()
    return elapsed / 1e9


def measure(
    model: Decoder,
    ids_by_length: dict[int, Tensor],
    modes: list[str],
    repeats: int = 7,
    warmup: int = 1,
    on_sample: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """Time every mode at every length; returns every repetition in the order run."""
    modes = check_modes(modes)
    loops = {
        length: {mode: (lambda ids=ids, mode=mode: decode(model, ids, mode)) for mode in modes}
        for length, ids in ids_by_length.items()
    }
    return measure_loops(loops, repeats, warmup, on_sample)


def measure_loops(
    loops: dict[int, dict[str, Callable[[], object]]],
    repeats: int = 7,
    warmup: int = 1,
    on_sample: Callable[[Sample], None] | None = None,
) -> list[Sample]:
    """The protocol itself, for any named loops: per length, `warmup` untimed calls per
    mode, then `repeats` repetitions in rotating mode order."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got repeats {repeats} and warmup {warmup}")
    samples = []
    for length, by_mode in loops.items():
        modes = list(by_mode)
        for mode in modes:
            for _ in range(warmup):
                by_mode[mode]()
        for repetition, order in enumerate(mode_orders(modes, repeats)):
            for position, mode in enumerate(order):
                sample = Sample(mode, length, repetition, position, time_call(by_mode[mode]))
                samples.append(sample)
                if on_sample is not None:
                    on_sample(sample)
    return samples


def per_step_seconds(model: Decoder, ids: Tensor, mode: str, warmup: int = 1) -> list[float]:
    """Duration of every decode step of one loop (step t = position t)."""
    from kvbench.cache import make_cache

    B, T = ids.shape
    for _ in range(warmup):
        decode(model, ids, mode)
    durations = []
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        with torch.inference_mode():
            cache = None if mode == FULL else make_cache(mode, model.config, batch=B, capacity=T)
            for t in range(T):
                start = time.perf_counter_ns()
                if cache is None:
                    model(ids[:, : t + 1])
                else:
                    _, cache = model(ids[:, t : t + 1], cache)
                durations.append((time.perf_counter_ns() - start) / 1e9)
    finally:
        if enabled:
            gc.enable()
    return durations


def _peak_rss() -> int | None:
    """The process's resident high-water mark (VmHWM) in bytes, where Linux reports it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # "5" resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def _trim_heap() -> bool:
    """Give freed heap memory back to the OS (glibc), so that the next loop's allocations
    show up as resident growth instead of reusing pages an earlier loop left behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def peak_memory_growth(run: Callable[[], object]) -> tuple[object, dict]:
    """Peak resident memory above the starting point while `run()` executes.

    Run apart from the timed repetitions so that sampling cannot perturb them.
    Uses the kernel's exact high-water mark when it can be reset; otherwise
    psutil's RSS before and after, which misses transient peaks and says so.
    """
    gc.collect()
    trimmed = _trim_heap()
    before = psutil.Process(os.getpid()).memory_info().rss
    if _reset_peak_rss() and _peak_rss() is not None:
        result = run()
        method = "VmHWM after clear_refs" + (" and malloc_trim" if trimmed else "")
        return result, {"peak_rss_growth_bytes": max(0, _peak_rss() - before), "peak_method": method}
    result = run()
    after = psutil.Process(os.getpid()).memory_info().rss
    return result, {"peak_rss_growth_bytes": max(0, after - before), "peak_method": "psutil rss after - before"}


def memory_profile(model: Decoder, ids: Tensor, mode: str) -> dict:
    """Cache bytes (formula, measured, reserved) and peak RSS growth of one decode loop."""
    if mode == FULL:
        _, peak = peak_memory_growth(lambda: decode(model, ids, mode))
        footprint = cache_footprint(model, ids, mode)
    else:
        footprint, peak = peak_memory_growth(lambda: cache_footprint(model, ids, mode))
    return {**footprint, **peak}


@dataclass
class RunOutcome:
    """Everything one benchmark run produced, as plain data for the record."""

    checks: list[dict]
    repetitions: list[dict]
    memory: list[dict]
    per_step: list[dict] | None
    interrupted: bool


def run_benchmark(
    model: Decoder,
    lengths: list[int],
    modes: list[str],
    batch: int = 1,
    seed: int = 0,
    repeats: int = 7,
    warmup: int = 1,
    per_step_length: int | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> RunOutcome:
    """The gate first, then bytes and peak memory, then the timed repetitions.

    A Ctrl-C during timing keeps the repetitions completed so far and marks the
    outcome interrupted; one during the gate propagates (nothing to keep).
    """
    modes = check_modes(modes)
    progress = on_progress or (lambda stage, done, total: None)
    longest = token_ids(model.config, batch, max(lengths), seed)
    ids_by_length = {length: longest[:, :length] for length in lengths}

    # Step t of the full-prefix path depends only on ids[:, :t + 1], so one
    # reference at the longest length serves every shorter one.
    progress("reference", 0, 1)
    reference = decode_full(model, longest, keep_logits=True)
    checks, memory = [], []
    cells = len(lengths) * len(modes)
    for length, ids in ids_by_length.items():
        for mode, result in check_equivalence(model, ids, modes, reference=reference).items():
            checks.append(result.to_dict())
            memory.append({"mode": mode, "length": length, **memory_profile(model, ids, mode)})
            progress("check", len(checks), cells)

    repetitions: list[dict] = []
    total = cells * repeats
    interrupted = False
    try:
        for length, ids in ids_by_length.items():
            measure(model, {length: ids}, modes, repeats, warmup,
                    on_sample=lambda s: (repetitions.append(s.to_dict()), progress("time", len(repetitions), total)))
    except KeyboardInterrupt:
        interrupted = True

    per_step = None
    if per_step_length is not None and not interrupted:
        ids = token_ids(model.config, batch, per_step_length, seed)
        per_step = [
            {"mode": mode, "length": per_step_length, "seconds": per_step_seconds(model, ids, mode, warmup)}
            for mode in modes
        ]
    return RunOutcome(checks, repetitions, memory, per_step, interrupted)
