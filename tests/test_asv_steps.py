"""The asv suite of steady steps (benchmarks/steps.py): the compiled modes are in it, gated like every mode,
compiled once per process in setup and never inside a sample.

The compile-marked test runs the suite's benchmark as asv runs it (asv_runner's own benchmark object: setup
before every sample, each sample one call) on the compile-marked tests' model, so inductor's cache from
tests/test_compiled.py serves it (seconds; about a minute cold)."""

from pathlib import Path

import pytest
import torch

from kvbench.models import compiled
from kvbench.modes import spec
from kvbench.workloads.workload import Contexts

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 64  # 64 + 20 positions: two blocks of the compiled step's span within the test model's 130


@pytest.fixture
def steps(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.chdir(tmp_path)
    import benchmarks.steps

    monkeypatch.setattr(benchmarks.steps, "PREPARED", {})  # a process's cells: this test's own
    return benchmarks.steps


def test_the_suite_times_the_compiled_modes_at_the_commands_window(steps):
    models, modes, contexts = steps.TimeStep.params
    assert [mode for mode in modes if spec(mode).compiled] == ["static-compiled"]
    assert modes[0] == "static" and models == ("llama-mini",) and contexts == (256,)  # asv passes indices
    window, last_step = steps.workloads()
    assert window == Contexts()  # kvbench run --contexts's gate
    assert last_step.positions(256) == window.positions(256) == 276  # the same positions: one buffer size
    assert last_step.timed_steps == 1 and last_step.warmup_steps == window.warmup_steps + window.timed_steps - 1
    # asv re-runs setup before every sample: one step each, and one process per cell, since each compiles
    assert (steps.TimeStep.number, steps.TimeStep.rounds, steps.TimeStep.warmup_time) == (1, 1, 0)


def test_a_mode_failing_the_contexts_gate_is_not_timed(steps, monkeypatch):
    calls = []

    def failing(model, ids, modes, context, options, warmup, timed):
        calls.append((tuple(ids.shape), tuple(modes), context, warmup, timed))
        return {modes[0]: {"passed": False, "max_abs_diff": 0.5}}

    monkeypatch.setattr(steps, "check_context", failing)
    bench = steps.TimeStep()
    for _ in range(2):  # the gate ran once in this process; every later setup refuses on its verdict
        with pytest.raises(RuntimeError, match="static at context 32 failed the equivalence gate"):
            bench.setup({}, "llama-tiny", "static", 32)
    assert calls == [((1, 52), ("static",), 32, 4, 16)]
    with pytest.raises(NotImplementedError, match="does not exist at this commit"):
        bench.setup({}, "llama-tiny", "no-such-mode", 32)


@pytest.mark.compile
def test_static_compiled_compiles_once_in_setup_and_never_in_a_sample(steps, monkeypatch, inductor_cache,
                                                                      compiled_config):
    from asv_runner.discovery import get_benchmark_from_name

    monkeypatch.setattr(steps.common, "config_for", lambda model, mode=None: compiled_config)
    monkeypatch.setattr(steps.TimeStep, "params", (("llama-tiny",), ("static-compiled",), (CONTEXT,)))
    benchmark = get_benchmark_from_name(str(ROOT / "benchmarks"), "steps.TimeStep.time_step-0",
                                        extra_params={"repeat": 4})
    benchmark.set_cache({})
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them: another test's graphs would count here
    compiled.compile_seconds.clear()
    prefills = []
    monkeypatch.setattr(compiled, "capacity_for", lambda length, config, plain=compiled.capacity_for: (
        prefills.append(length), plain(length, config))[1])
    assert benchmark.do_setup() is False  # not skipped: the gate ran, and compiled
    assert len(compiled.compile_seconds["static-compiled"]) == 1
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        result = benchmark.do_run()
    benchmark.do_teardown()
    assert len(result["samples"]) == 4 and result["number"] == 1
    assert len(compiled.compile_seconds["static-compiled"]) == 1  # no compile in any sample, nor in their setups
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs == 1
    # the gate's request, then one prefill of the whole window per sample, in setup (asv's first sample reuses
    # the setup asv ran before it)
    assert prefills == [CONTEXT + 20] * 5
    assert max(result["samples"]) < 1.0  # one step of a tiny model, not a compile
