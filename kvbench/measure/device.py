"""The devices a run can put its model on: each one a `Device` registered by name, so that a new device is a file
plus a registration (its clock registers in kvbench.measure.clock), never a switch on a name.

`--device` takes a registered name or "auto" (the first usable device other than the CPU, else the CPU).
`present()` answers without torch, so that `kvbench run --device cuda` on a machine without a GPU is refused
before torch is imported; `usable()` asks torch, once it is imported, before the model is built. A device's
`prepare()` sets its numerics before any kernel runs (TF32 off: a float32 gate compares float32, not TF32) and
says what took effect; `facts()` is the record's "device" section (name, capability, memory, driver, clocks...);
`memory(run)` the device memory a call peaked at. The CPU has none of these: its record is the one it always was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from kvbench.measure import gpu

__all__ = ["AUTO", "DEVICES", "Device", "choices", "device_of", "refusal", "register_device", "resolve"]

AUTO = "auto"


@dataclass(frozen=True)
class Device:
    name: str
    present: Callable[[], str | None] = lambda: None  # torch-free: None, or why this machine has none
    usable: Callable[[], str | None] = lambda: None  # with torch: None, or why torch cannot use it
    prepare: Callable[[], dict] = dict  # numerics set before the model is built: {setting: value in effect}
    facts: Callable[[], dict | None] = lambda: None  # the record's "device" section (None: nothing beyond the CPU's)
    memory: Callable[[Callable[[], object]], dict] = lambda run: (run(), {})[1]  # a call's device memory peaks
    cache_bytes: Callable[[], int | None] = lambda: None  # its last-level cache (the limits' buffers exceed it)
    threaded: bool = True  # its kernels run on torch's host threads (the limits are measured per thread count)
    model_dtype_matmuls: bool = False  # the limits' matmuls in the model's dtype (float32 on the CPU, as always)
    kernels: Callable[[Callable[[], object]], dict] | None = None  # which attention kernels a call launched


DEVICES: dict[str, Device] = {
    "cpu": Device("cpu"),
    "cuda": Device("cuda", present=gpu.present, usable=gpu.usable, prepare=gpu.prepare, facts=gpu.facts,
                   memory=gpu.memory_peaks, cache_bytes=gpu.l2_bytes, threaded=False, model_dtype_matmuls=True,
                   kernels=gpu.attention_kernels),
}


def device_of(device: object) -> Device:
    """The registered Device of a torch.device (or its type's name); a type without one (meta) is treated as the
    CPU: nothing to prepare, no facts, no device memory."""
    return DEVICES.get(str(getattr(device, "type", device)).partition(":")[0], DEVICES["cpu"])


def register_device(device: Device) -> None:
    DEVICES[device.name] = device


def choices() -> list[str]:
    return [AUTO, *DEVICES]


def refusal(choice: str) -> str | None:
    """Torch-free: why `--device choice` cannot run on this machine, or None (auto never refuses)."""
    if choice == AUTO:
        return None
    if choice not in DEVICES:
        return f"expected one of {choices()}, got {choice!r}"
    return DEVICES[choice].present()


def resolve(choice: str) -> str:
    """The device a run uses (torch imported): `choice` when torch can use it (ValueError with the reason when it
    cannot), for "auto" the first registered device other than the CPU that is present and usable, else "cpu"."""
    if choice == AUTO:
        return next((name for name, device in DEVICES.items()
                     if name != "cpu" and device.present() is None and device.usable() is None), "cpu")
    reason = refusal(choice) or DEVICES[choice].usable()
    if reason is not None:
        raise ValueError(f"device {choice!r} cannot be used: {reason}")
    return choice
