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
from typing import TYPE_CHECKING, Callable

import psutil

try:
    import resource
except ImportError:  # not on Windows: no address-space limit to read
    resource = None

from kvbench.budget import parse_size
from kvbench.config import PlainConfig
from kvbench.kinds import expected_cache_bytes, parameter_count, rotary_table_bytes
from kvbench.modes import FULL_PREFIX, SPECS
from kvbench.telemetry import cgroup_directories

if TYPE_CHECKING:
    from torch import Tensor

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


def memory_profile(model: Decoder, ids: Tensor, mode: str, options: dict | None = None) -> dict:
    """Cache bytes (formula, measured, reserved) and peak RSS growth of one decode loop."""
    from kvbench.decode import cache_footprint, decode  # the estimates above need no torch; this does

    if not SPECS[mode].keeps_state:  # its footprint is one forward: the peak is the whole loop's
        _, peak = peak_memory_growth(lambda: decode(model, ids, mode))
        footprint = cache_footprint(model, ids, mode)
    else:
        footprint, peak = peak_memory_growth(lambda: cache_footprint(model, ids, mode, options))
    return {**footprint, **peak}


def estimate_run_bytes(config: PlainConfig, batch: int, lengths: list[int], modes: list[str]) -> dict[str, int]:
    """What a run allocates at its peak, part by part, before it allocates any of it.

    Conservative on purpose: the weights (counted from the shapes of either family; built in
    float32 before they are cast, so never fewer than 4 bytes each) and the llama family's
    rotary tables, the token ids (drawn for max_length), the logits the gate keeps and
    compares in float64, a cache of the longest length and concat's copy of it, and the
    activations of the full-prefix path's last step (attention scores of (B, H, T, T) included),
    and transformers' copy of the weights when an hf-* mode runs.
    """
    T, B, elt = max(lengths), batch, config.element_bytes
    C, V, H, KVH, D, I = (config.width, config.vocab_size, config.heads, config.kv_heads, config.head_dim,
                          config.intermediate_size)
    qkv = (H + 2 * KVH) * D
    parts = {
        "weights" if elt >= 4 else "weights (built in float32)": weight_build_bytes(config),
        "token ids": 2 * B * config.max_length * 8,
        "gate logits": B * T * V * (2 * elt + 4 * 8 + 2),
        "caches": 2 * expected_cache_bytes(config, B, T),
    }
    if any(SPECS[mode].source == FULL_PREFIX for mode in modes):
        parts["full-prefix activations"] = B * T * (4 * C + 3 * I + qkv + 2 * V) * elt + 2 * B * H * T * T * elt
    if any(SPECS[mode].copies_weights for mode in modes):
        parts["transformers' copy of the weights"] = parameter_count(config) * elt
    return parts


def weight_build_bytes(config: PlainConfig) -> int:
    """The weights as they are built: never fewer than 4 bytes each (random ones are drawn in float32, a
    GGUF's are dequantized to float32, before either is cast to the dtype), and the llama family's rotary tables."""
    return parameter_count(config) * max(config.element_bytes, 4) + rotary_table_bytes(config)


AVAILABLE_MEMORY_VARIABLE = "KVBENCH_AVAILABLE_MEMORY"


def stated_limit() -> int | None:
    """The memory a user (or a test) states this process may take, from KVBENCH_AVAILABLE_MEMORY
    (bytes, or a size such as 4GiB); None when unset. It makes a refusal depend on the stated figure,
    not on the size of whichever machine runs it."""
    text = os.environ.get(AVAILABLE_MEMORY_VARIABLE)
    if text is None:
        return None
    try:
        return parse_size(text, allow_zero=True)
    except ValueError as error:
        raise ValueError(f"{AVAILABLE_MEMORY_VARIABLE}: {error}") from None


def available_bytes() -> int:
    """What this process may still allocate: the least of the machine's available memory,
    the headroom under its address-space limit (`ulimit -v`), its cgroup's (a container's
    memory limit) and the stated limit of KVBENCH_AVAILABLE_MEMORY. The machine can have
    24 GiB free while the process may take 4."""
    limits = [psutil.virtual_memory().available]
    if resource is not None:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            limits.append(max(0, soft - psutil.Process().memory_info().vms))
    for limit in (cgroup_headroom(), stated_limit()):
        if limit is not None:
            limits.append(limit)
    return min(limits)


CGROUP_FILES = (("memory.max", "memory.current"),  # v2
                ("memory.limit_in_bytes", "memory.usage_in_bytes"))  # v1


def cgroup_headroom(root: str = "/sys/fs/cgroup", membership: str = "/proc/self/cgroup") -> int | None:
    """The limit less the usage of this process's memory cgroup (v2 or v1), or None without a limit."""
    total = psutil.virtual_memory().total
    for directory in cgroup_directories("memory", root, membership):
        for limit_name, usage_name in CGROUP_FILES:
            try:
                limit = (directory / limit_name).read_text().strip()
                usage = int((directory / usage_name).read_text())
            except (OSError, ValueError):
                continue
            if limit != "max" and int(limit) < total:  # v1 writes "no limit" as ~2**63
                return max(0, int(limit) - usage)
    return None
