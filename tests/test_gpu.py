"""On a CUDA device (scripts/gpu_check.sh runs these; tests/conftest.py skips them, with the reason, where torch sees
none): every kind equivalent to the full path on the device, the event clock, the device memory peaks, and a whole
`kvbench run --device cuda` whose record names its device, clock, kernels, memory and limits."""

from __future__ import annotations

import pytest
import torch

from kvbench import modes
from kvbench.cli import main
from kvbench.measure import device as devices
from kvbench.measure import gpu
from kvbench.measure.clock import clock_for
from kvbench.measure.telemetry import Counters
from kvbench.measure.timing import time_call, time_observed
from kvbench.model import build_model, preset_config
from kvbench.record import load_record
from kvbench.workloads.decode import run_gate, token_ids

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
# every kvbench kind the llama family runs without a window, and transformers' caches on the same weights
KINDS = [name for name in modes.names() if not modes.spec(name).requires_window and not modes.spec(name).compiled
         and name != "full"]


def runnable(config) -> list[str]:
    """KINDS whose requirements this machine meets (transformers' quantized caches need their backends)."""
    found = []
    for name in KINDS:
        try:
            modes.spec(name).require(config)
        except ValueError:
            continue
        found.append(name)
    return found


@pytest.fixture(scope="module", autouse=True)
def prepared():
    gpu.prepare()  # TF32 off, as a run sets it
    yield


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_every_kind_is_equivalent_to_the_full_path_on_the_device(dtype):
    config = preset_config("llama-mini", max_length=2048, dtype=dtype)
    model = build_model(config, seed=0, device=CUDA)
    ids = token_ids(config, 1, 96, device=model.device)
    checks = run_gate(model, ids, [48, 96], runnable(config))
    failed = {key: (check.get("error"), check["max_abs_diff"]) for key, check in checks.items() if not check["passed"]}
    assert failed == {}


def test_the_device_runs_the_cpus_numbers_within_the_kernels_tolerance():
    config = preset_config("llama-mini", max_length=2048)
    on_cpu, on_gpu = build_model(config, seed=0), build_model(config, seed=0, device=CUDA)
    ids = token_ids(config, 1, 64)
    with torch.inference_mode():
        difference = (on_cpu(ids)[0] - on_gpu(ids.to(CUDA))[0].cpu()).abs().max().item()
    assert difference < 1e-3


def test_the_event_clock_times_the_device_with_the_hosts_time_beside():
    clock = clock_for(CUDA)
    x = torch.randn(4096, 4096, device=CUDA)
    seconds = time_call(lambda: [x @ x for _ in range(10)], clock)
    assert clock.name == "torch.cuda.Event" and 1e-5 < seconds < 10  # 1.4 TFLOP
    counters = Counters(clock=clock)
    try:
        device_seconds, seen = time_observed(lambda: [x.add_(1.0) for _ in range(200)], counters, clock)
    finally:
        counters.close()
    assert device_seconds > 0 and seen["host_seconds"] > 0


def test_a_calls_device_memory_peak_counts_what_it_allocated():
    held = []
    peaks = gpu.memory_peaks(lambda: held.append(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)))
    assert peaks["device_growth_bytes"] >= 64 << 20
    assert peaks["device_reserved_bytes"] >= peaks["device_allocated_bytes"]


def test_auto_is_cuda_here_and_the_facts_name_the_device():
    assert devices.resolve("auto") == "cuda"
    facts = gpu.facts()
    assert facts["type"] == "cuda" and facts["sm_count"] > 0 and facts["memory_bytes"] > 0
    assert facts["compute_capability"].count(".") == 1 and facts["cuda_runtime"]


def test_a_contexts_run_on_cuda_records_its_device_clock_kernels_memory_and_limits(tmp_path, capsys):
    path = tmp_path / "cuda.json"
    code = main(["run", "--preset", "llama-mini", "--contexts", "64,128", "--modes", "full,static,paged",
                 "--repeats", "2", "--warmup", "1", "--no-progress", "--device", "cuda", "--output", str(path)])
    capsys.readouterr()
    assert code == 0
    record = load_record(path)
    assert record["protocol"]["device"] == "cuda" and record["protocol"]["clock"] == "torch.cuda.Event"
    assert record["device"]["type"] == "cuda" and set(record["device"]["attention"]) == {"full", "static", "paged"}
    assert record["device"]["settings"]["matmul_allow_tf32"] is False
    assert all(entry["device_allocated_bytes"] > 0 for entry in record["memory"])
    assert record["limits"]["device"] == "cuda" and record["limits"]["memory_bandwidth"]["copy"]["1"]["median"] > 1e11
    assert all(r["host_seconds"] > 0 for r in record["repetitions"])
