"""--device and the device clock, on a CPU: the choice refused in one line where the machine has no such device,
"auto" falling back to the CPU, an explicit --device cpu writing the record the default writes, and the event
clock's logic (marks, one wait, device time with the host's beside) driven by fake events, through a whole run."""

from __future__ import annotations

import json
import statistics
import time

import pytest
import torch

from kvbench.cli import main
from kvbench.kinds import CONTEXT_TIMED_STEPS, CONTEXT_WARMUP_STEPS, tolerance_for
from kvbench.measure import clock as clocks
from kvbench.measure import estimation
from kvbench.measure import device as devices
from kvbench.measure import gpu
from kvbench.measure.clock import EventClock, clock_for, register_clock
from kvbench.measure.telemetry import Counters
from kvbench.measure.timing import Protocol, step_durations, time_call, time_observed
from kvbench.models.compiled import compiling
from kvbench.record import RecordView, load_record
from kvbench.report.record.model import build_report

TINY = ["--preset", "seed", "--modes", "full,static", "--repeats", "2", "--warmup", "0", "--no-progress"]


class FakeStream:
    """A device whose work takes `step_ms` per event recorded after it; events are stamped with the stream's time."""

    def __init__(self, step_ms: float = 1.0) -> None:
        self.now_ms, self.step_ms, self.waits = 0.0, step_ms, 0

    def event(self):
        stream = self

        class Event:
            def record(self) -> None:
                stream.now_ms += stream.step_ms
                self.at = stream.now_ms

            def elapsed_time(self, other) -> float:
                return other.at - self.at

        return Event()

    def synchronize(self) -> None:
        self.waits += 1

    def clock(self) -> EventClock:
        return EventClock("fake.Event", self.event, self.synchronize)


def test_the_event_clock_times_a_call_on_the_device_and_waits_once_after_the_second_mark():
    stream = FakeStream(step_ms=2.5)
    assert time_call(lambda: None, stream.clock()) == pytest.approx(0.0025)
    assert stream.waits == 1


def test_steps_on_the_event_clock_are_the_devices_and_the_host_waits_only_after_the_last():
    """A launch-bound loop: the host issues the steps at once, the device takes 3 ms each; only one wait."""
    stream = FakeStream(step_ms=3.0)
    assert step_durations(iter(range(4)), clock=stream.clock()) == pytest.approx([0.003] * 4)
    assert stream.waits == 1


def test_a_sample_on_the_event_clock_keeps_the_hosts_time_beside_the_devices():
    stream, counters = FakeStream(step_ms=0.001), Counters(clock=HOSTLESS)  # the device: a microsecond
    try:
        seconds, seen = time_observed(lambda: time.sleep(0.01), counters, stream.clock())
    finally:
        counters.close()
    assert seconds == pytest.approx(1e-6) and seen["host_seconds"] >= 0.01  # launch-bound: host >> device


HOSTLESS = clock_for("cpu")


def test_each_device_type_has_its_registered_clock_and_an_unknown_one_is_refused():
    assert clock_for("cpu") is clocks.HOST and clock_for(torch.device("cpu")) is clocks.HOST
    assert clock_for("cuda:1").name == "torch.cuda.Event" and clock_for("cuda").host_beside  # made, not yet used
    assert Protocol(device="cuda").describe({})["clock"] == "torch.cuda.Event"
    with pytest.raises(ValueError, match="expected a device type with a clock, one of .*got 'tpu'"):
        clock_for("tpu")
    with pytest.raises(ValueError, match="device must be one of"):
        Protocol(device="tpu")


def test_a_registered_device_type_gets_its_own_clock(monkeypatch):
    monkeypatch.setattr(clocks, "CLOCKS", dict(clocks.CLOCKS))
    monkeypatch.setattr(clocks, "_made", {})
    register_clock("xpu", FakeStream().clock)
    assert clock_for("xpu:0").name == "fake.Event" and clock_for("xpu") is clock_for("xpu")


def test_auto_is_the_cpu_without_a_gpu_and_cuda_when_the_device_is_there_and_usable(monkeypatch):
    monkeypatch.setitem(devices.DEVICES, "cuda", devices.Device("cuda", present=lambda: "no device node"))
    assert devices.resolve("auto") == "cpu" and devices.refusal("auto") is None
    with pytest.raises(ValueError, match="device 'cuda' cannot be used: no device node"):
        devices.resolve("cuda")
    monkeypatch.setitem(devices.DEVICES, "cuda", devices.Device("cuda", usable=lambda: "torch sees none"))
    assert devices.resolve("auto") == "cpu"
    with pytest.raises(ValueError, match="torch sees none"):
        devices.resolve("cuda")
    monkeypatch.setitem(devices.DEVICES, "cuda", devices.Device("cuda"))
    assert devices.resolve("auto") == "cuda" and devices.refusal("tpu").startswith("expected one of ['auto', 'cpu'")


@pytest.mark.parametrize("stage, said", [("present", "no GPU (present)"),
                                         ("usable", "device 'cuda' cannot be used: no GPU (usable)")])
def test_device_cuda_without_cuda_is_one_line_and_exit_2_before_any_model(stage, said, monkeypatch, capsys,
                                                                           tmp_path):
    """Refused torch-free when the machine has no device node, or once torch says it sees no device: either way
    before the model is built and nothing is written."""
    monkeypatch.setitem(devices.DEVICES, "cuda", devices.Device("cuda", **{stage: lambda: f"no GPU ({stage})"}))
    built = []
    monkeypatch.setattr("kvbench.cli.run.load_model", lambda *a: built.append(a))
    code = main(["run", *TINY, "--lengths", "4", "--device", "cuda", "--output", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [f"kvbench: error: --device cuda: {said}"]
    assert not built and not (tmp_path / "r.json").exists()


def comparable(record: dict) -> dict:
    """What a run decides, not what it timed: its settings, gate and bytes."""
    protocol = {key: value for key, value in record["protocol"].items() if not key.endswith("_in_effect")}
    memory = [{key: value for key, value in entry.items() if "peak" not in key} for entry in record["memory"]]
    checks = [dict(check) for check in record["checks"]]
    return {"config": record["config"], "run": record["run"], "protocol": protocol, "checks": checks,
            "memory": memory, "cells": [(r["mode"], r["length"], r["repetition"]) for r in record["repetitions"]],
            "sections": sorted(record)}


def test_an_explicit_device_cpu_writes_the_record_the_default_writes(capsys, tmp_path):
    paths = [tmp_path / "default.json", tmp_path / "cpu.json"]
    assert main(["run", *TINY, "--lengths", "4,8", "--output", str(paths[0])]) == 0
    assert main(["run", *TINY, "--lengths", "4,8", "--device", "cpu", "--output", str(paths[1])]) == 0
    capsys.readouterr()
    default, explicit = (json.loads(path.read_text()) for path in paths)
    assert comparable(default) == comparable(explicit)
    assert explicit["protocol"]["device"] == "cpu" and explicit["protocol"]["clock"] == "time.perf_counter_ns"
    assert "device" not in explicit and not any("host_seconds" in r for r in explicit["repetitions"])
    assert not any(key.startswith("device_") for entry in explicit["memory"] for key in entry)


def test_a_contexts_run_on_an_event_clock_records_device_steps_with_the_hosts_time_beside(monkeypatch, capsys,
                                                                                          tmp_path):
    """The CPU's clock registered as a fake device's: every step is 0.5 ms of the fake stream, every sample keeps
    the host's seconds beside, and the record names the clock."""
    stream = FakeStream(step_ms=0.5)
    monkeypatch.setattr(clocks, "_made", {"cpu": stream.clock()})
    path = tmp_path / "contexts.json"
    assert main(["run", *TINY, "--contexts", "8", "--output", str(path)]) == 0
    capsys.readouterr()
    record = load_record(path)
    assert record["protocol"]["clock"] == "fake.Event"
    samples = record["repetitions"]
    assert samples and all(r["host_seconds"] > 0 for r in samples)
    assert {round(s, 6) for r in samples for s in r["step_seconds"]} == {0.0005}
    # a sample's two marks enclose its timed steps' own marks (one before the first step, one after each): every
    # event recorded between them is 0.5 ms of the stream
    assert {round(r["seconds"], 6) for r in samples} == {round(0.0005 * (CONTEXT_TIMED_STEPS + 2), 6)}
    assert {len(r["step_seconds"]) for r in samples} == {CONTEXT_WARMUP_STEPS + CONTEXT_TIMED_STEPS}
    # the report names the clock and the host's time beside the device's (on a device: here the record says cuda)
    on_device = {**record, "protocol": {**record["protocol"], "device": "cuda"}}
    notes = build_report(RecordView(on_device)).notes
    said = [note for note in notes if note.startswith("on cuda: every time is on fake.Event")]
    ratio = statistics.median(r["host_seconds"] / r["seconds"] for r in samples if r["mode"] == "static")
    assert len(said) == 1 and f"static {ratio:.2f}" in said[0]
    assert not any("fake.Event" in note for note in build_report(RecordView(record)).notes)  # the CPU's: no note


def test_nvidia_smis_line_is_read_with_its_numbers_and_without_what_it_cannot_say():
    line = "NVIDIA H200, 570.86.15, 00000000:19:00.0, 1980, 3201, 1980, 3201, Enabled, [N/A], 700.00, 34, P0, Default"
    found = gpu.parse_smi(line + "\n")
    assert found == {"smi_name": "NVIDIA H200", "driver_version": "570.86.15", "pci_bus_id": "00000000:19:00.0",
                     "sm_clock_mhz": 1980, "memory_clock_mhz": 3201, "max_sm_clock_mhz": 1980,
                     "max_memory_clock_mhz": 3201, "persistence_mode": "Enabled", "power_limit_w": 700.0,
                     "temperature_c": 34, "pstate": "P0", "compute_mode": "Default"}
    with pytest.raises(ValueError, match="expected 13 comma-separated values from nvidia-smi, got 2"):
        gpu.parse_smi("a, b")


def test_a_gpus_facts_keep_what_each_source_said_and_why_a_source_said_nothing():
    def broken(index):
        raise FileNotFoundError("nvidia-smi is not on the PATH")

    found = gpu.facts(0, {"torch": lambda index: {"name": "H200", "sm_count": 132, "l2": None}, "nvidia-smi": broken})
    assert found == {"type": "cuda", "name": "H200", "sm_count": 132,
                     "unavailable": {"nvidia-smi": "FileNotFoundError: nvidia-smi is not on the PATH"}}


def test_the_sdpa_backend_is_read_from_the_kernels_a_call_launched():
    assert gpu.classify_kernels(["pytorch_flash::flash_fwd_kernel<...>", "ampere_sgemm"]) == ["flash"]
    assert gpu.classify_kernels(["fmha_cutlassF_f32_aligned_64x64_rf_sm80", "gemv2T_kernel"]) == ["efficient"]
    assert gpu.classify_kernels(["cudnn_generated_fort_native_sdpa_sm90"]) == ["cudnn"]
    assert gpu.classify_kernels(["void (anonymous namespace)::softmax_warp_forward", "gemm"]) == ["math"]
    assert gpu.classify_kernels(["gemm"]) == []


def test_a_devices_gate_is_held_to_its_kernels_floor_and_the_cpus_is_unchanged():
    assert tolerance_for("float32", 2) == (1e-5, 1e-5) and tolerance_for("float32", 2, "cuda") == (1e-4, 1e-4)
    assert tolerance_for("bfloat16", 4, "cuda") == pytest.approx((0.06, 0.06))  # the depth's bound is larger
    assert tolerance_for("float64", 2, "cuda") == (1e-10, 1e-10)  # no floor for a dtype the table lacks


def test_compiled_steps_capture_cuda_graphs_on_cuda_and_compile_plainly_elsewhere():
    assert compiling(torch.device("cpu")).mode is None and compiling(torch.device("meta")).mode is None
    cuda = compiling(torch.device("cuda"))
    logits = torch.ones(2)
    assert cuda.mode == "reduce-overhead" and cuda.keep(logits) is not logits and torch.equal(cuda.keep(logits), logits)


def test_a_device_timed_length_stays_on_the_devices_time_however_long_the_host_waited_for_a_cpu():
    """The thread's CPU time stands in for wall time when a neighbour shares the host's CPU; a device's samples are
    the device's time, which the host's waits do not reach."""
    waited = {"mode": "static", "length": 8, "repetition": 0, "seconds": 0.01, "cpu_seconds": 0.002,
              "runqueue_seconds": 0.009}
    assert estimation.choose(8, [waited] * 4, threads=1).clock == "cpu"
    chosen = estimation.choose(8, [{**waited, "host_seconds": 0.012}] * 4, threads=1)
    assert chosen.clock == "wall" and chosen.reason.endswith("timed on a device's clock, which the host's waits do "
                                                             "not reach: the device's time")
