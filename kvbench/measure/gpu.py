"""A CUDA device's facts, numerics, memory and kernels, for kvbench.measure.device's "cuda" registration.

Torch-free at import, as the rest of measure/. Every fact is read the way pyperf reads one: a source that cannot
be read leaves its keys absent and its reason under "unavailable", never a failed run. The sources: torch.cuda's
device properties and versions, `nvidia-smi --query-gpu` (clocks, persistence, ECC, power: what torch does not
say) when it is on the PATH, and pynvml when it is importable (the driver's own version and the current clocks).
"""

from __future__ import annotations

import glob
import shutil
import subprocess
from typing import Callable

__all__ = ["SMI_FIELDS", "attention_kernels", "classify_kernels", "facts", "l2_bytes", "memory_peaks",
           "parse_smi", "prepare", "present", "usable"]

SMI_TIMEOUT_S = 10.0
# nvidia-smi's query name -> the record's key
SMI_FIELDS = {"name": "smi_name", "driver_version": "driver_version", "pci.bus_id": "pci_bus_id",
              "clocks.sm": "sm_clock_mhz", "clocks.mem": "memory_clock_mhz", "clocks.max.sm": "max_sm_clock_mhz",
              "clocks.max.mem": "max_memory_clock_mhz", "persistence_mode": "persistence_mode",
              "ecc.mode.current": "ecc_mode", "power.limit": "power_limit_w", "temperature.gpu": "temperature_c",
              "pstate": "pstate", "compute_mode": "compute_mode"}
# the fused attention kernels by what their names hold (torch's flash, memory-efficient and cuDNN SDPA backends)
KERNEL_FAMILIES = {"flash": ("flash",), "efficient": ("fmha", "efficient", "cutlassf"), "cudnn": ("cudnn",)}


def present() -> str | None:
    """Torch-free: None when the machine shows an NVIDIA device node, else why kvbench will not try CUDA."""
    if glob.glob("/dev/nvidia[0-9]*") or glob.glob("/dev/dxg"):
        return None
    return "no NVIDIA GPU on this machine (no /dev/nvidia* device)"


def usable() -> str | None:
    import torch

    if torch.cuda.is_available():
        return None
    return f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'}) sees no CUDA device"


def prepare() -> dict:
    """TF32 off, so that float32 means float32 in the gate and the timings; the settings that took effect."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def parse_smi(text: str) -> dict:
    """One GPU's line of `nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits`: numbers as numbers,
    "[N/A]" and "[Not Supported]" left out."""
    values = [value.strip() for value in text.strip().splitlines()[0].split(",")] if text.strip() else []
    if len(values) != len(SMI_FIELDS):
        raise ValueError(f"expected {len(SMI_FIELDS)} comma-separated values from nvidia-smi, got {len(values)}")
    found: dict[str, object] = {}
    for key, value in zip(SMI_FIELDS.values(), values):
        if not value or value.startswith("["):
            continue
        try:
            found[key] = float(value) if "." in value else int(value)
        except ValueError:
            found[key] = value
    return found


def smi_facts(index: int) -> dict:
    if shutil.which("nvidia-smi") is None:
        raise FileNotFoundError("nvidia-smi is not on the PATH")
    query = ["nvidia-smi", f"--id={index}", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    done = subprocess.run(query, capture_output=True, text=True, timeout=SMI_TIMEOUT_S, check=True)
    return parse_smi(done.stdout)


def nvml_facts(index: int) -> dict:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {"nvml_driver_version": driver.decode() if isinstance(driver, bytes) else driver,
                "nvml_sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "nvml_memory_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)}
    finally:
        pynvml.nvmlShutdown()


def torch_facts(index: int) -> dict:
    import torch

    properties = torch.cuda.get_device_properties(index)
    return {"index": index, "name": properties.name, "compute_capability": f"{properties.major}.{properties.minor}",
            "sm_count": properties.multi_processor_count, "memory_bytes": properties.total_memory,
            "l2_cache_bytes": getattr(properties, "L2_cache_size", None), "cuda_runtime": torch.version.cuda,
            "cudnn_version": torch.backends.cudnn.version(), "device_count": torch.cuda.device_count(),
            "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient_sdp_enabled": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled(),
            "math_sdp_enabled": torch.backends.cuda.math_sdp_enabled(),
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32}


def facts(index: int = 0, sources: dict[str, Callable[[int], dict]] | None = None) -> dict:
    """The record's "device" section: {"type": "cuda", fact: value..., "unavailable": {source: reason}}."""
    found: dict[str, object] = {"type": "cuda"}
    unavailable: dict[str, str] = {}
    for name, read in (sources or {"torch": torch_facts, "nvidia-smi": smi_facts, "pynvml": nvml_facts}).items():
        try:
            found.update({key: value for key, value in read(index).items() if value is not None})
        except Exception as error:  # noqa: BLE001 - a missing source is an absent fact with its reason
            unavailable[name] = f"{type(error).__name__}: {error}".strip()[:300]
    return {**found, "unavailable": unavailable}


def l2_bytes() -> int | None:
    import torch

    return getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", None) or None


def memory_peaks(run: Callable[[], object]) -> dict:
    """The device memory `run` peaked at, its peak statistics reset first: allocated (and its growth over what
    was allocated before, the weights among it) and reserved by the caching allocator, in bytes."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {"device_allocated_bytes": peak, "device_growth_bytes": max(peak - before, 0),
            "device_reserved_bytes": torch.cuda.max_memory_reserved()}


def classify_kernels(names: list[str]) -> list[str]:
    """The SDPA backends a list of launched kernels' names shows: flash, efficient, cudnn, or math (a softmax
    launched and no fused attention kernel)."""
    lowered = [name.lower() for name in names]
    found = [family for family, marks in KERNEL_FAMILIES.items() if any(m in name for name in lowered for m in marks)]
    if not found and any("softmax" in name for name in lowered):
        found.append("math")
    return found


def attention_kernels(run: Callable[[], object]) -> dict:
    """{"sdpa": the backends `run` launched, "kernels": how many distinct kernels}, from torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as profiled:
        run()
        torch.cuda.synchronize()
    names = sorted({event.key for event in profiled.key_averages()})
    return {"sdpa": classify_kernels(names), "kernels": len(names)}
