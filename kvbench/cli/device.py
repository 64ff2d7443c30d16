"""`--device`: refused before torch is imported when the machine cannot have the device, resolved ("auto") and
checked once torch is, then prepared (its numerics) before the model is built. The record's protocol names the
device and its clock; a device other than the CPU adds its "device" section (kvbench.record.device)."""

from __future__ import annotations

import argparse
import dataclasses

from kvbench.cli.parser import CliError
from kvbench.measure import device as devices
from kvbench.measure import timing


def checked_device(args: argparse.Namespace) -> str:
    """Torch-free: the device the Protocol is built with ("auto" stands as the CPU until resolved), or the one-line
    refusal when this machine cannot have it."""
    reason = devices.refusal(args.device)
    if reason is not None:
        raise CliError(f"--device {args.device}: {reason}")
    return "cpu" if args.device == devices.AUTO else args.device


def settle(args: argparse.Namespace, protocol) -> tuple[object, dict | None, dict]:
    """Threads and CPU pinned, then the device resolved and prepared, before any torch work: (the protocol on its
    device, the record's "device" section or None, what took effect for the record's protocol)."""
    in_effect = {"threads_in_effect": timing.set_threads(protocol.threads),
                 "cpu_in_effect": timing.pin_cpu(protocol.cpu)}
    protocol, facts = use_device(args, protocol, in_effect)
    return protocol, facts, in_effect


def device_section(facts: dict | None, attention: dict | None) -> dict:
    """{"device": what the run ran on, with the attention kernels each mode launched there}, or {} on the CPU."""
    if facts is None:
        return {}
    return {"device": {**facts, **({"attention": attention} if attention else {})}}


def use_device(args: argparse.Namespace, protocol, in_effect: dict) -> tuple[object, dict | None]:
    """(the protocol on the resolved device, the record's "device" section or None on the CPU), torch imported;
    the device's numerics set now, before any model, and kept in `in_effect` when it has any."""
    try:
        name = devices.resolve(args.device)
    except ValueError as error:
        raise CliError(f"--device {args.device}: {error}") from None
    device = devices.DEVICES[name]
    settings = device.prepare()
    if settings:
        in_effect["device_settings"] = settings
    facts = device.facts()
    if facts is not None and settings:
        facts["settings"] = settings
    return dataclasses.replace(protocol, device=name), facts
