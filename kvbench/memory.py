"""Memory probes: the resident high-water mark of one decode loop, apart from the timed ones.

Linux reports the process's peak resident size (VmHWM) and lets a process reset it
(``/proc/self/clear_refs``); glibc can hand freed heap back to the kernel
(``malloc_trim``), so a loop's allocations show as growth instead of reusing pages an
earlier loop left behind. Where either is missing, the probe falls back and says so.
"""

from __future__ import annotations

import ctypes
import gc
import os
from typing import Callable

import psutil
from torch import Tensor

from kvbench.decode import FULL, cache_footprint, decode
from kvbench.model import Decoder


def peak_rss() -> int | None:
    """The process's resident high-water mark (VmHWM) in bytes, where Linux reports it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # "5" resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def trim_heap() -> bool:
    """Give freed heap memory back to the OS (glibc); False where there is no malloc_trim."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def peak_memory_growth(run: Callable[[], object]) -> tuple[object, dict]:
    """Peak resident memory above the starting point while `run()` executes.

    Uses the kernel's exact high-water mark when it can be reset; otherwise psutil's
    RSS before and after, which misses transient peaks and says so in the method.
    """
    gc.collect()
    trimmed = trim_heap()
    before = psutil.Process(os.getpid()).memory_info().rss
    if reset_peak_rss() and peak_rss() is not None:
        result = run()
        method = "VmHWM after clear_refs" + (" and malloc_trim" if trimmed else "")
        return result, {"peak_rss_growth_bytes": max(0, peak_rss() - before), "peak_method": method}
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
