"""The compiled modes: the same gate as every kind, one compile per process, no recompile per step, and a
one-line refusal where torch.compile cannot run.

Tests marked `compile` build C++ with inductor: about 60 s cold on 2 busy cores for each compiled function,
a few seconds once inductor's cache holds it, so they share one persistent cache under pytest's cache
directory and use the smallest llama model; there are two of them (one per compiled mode)."""

import pytest
import torch

from kvbench.cli import main
from kvbench.config import preset_config
from kvbench.kinds import cxx_compiler, require_compiled
from kvbench.model import build_model
from kvbench.models import compiled
from kvbench.workloads import requests
from kvbench.workloads.decode import check_equivalence, token_ids


@pytest.fixture(scope="module")
def llama(compiled_config):
    return build_model(compiled_config, seed=0)


def test_spans_are_whole_blocks_within_the_buffer():
    assert [compiled.span(t, 300) for t in (0, 63, 64, 127, 128, 299)] == [64, 64, 128, 128, 192, 300]
    config = preset_config("llama-tiny", max_length=130)
    assert [compiled.capacity_for(n, config) for n in (1, 64, 65, 130)] == [64, 64, 128, 130]


@pytest.mark.compile
def test_static_compiled_passes_the_gate_with_one_program_for_every_step_context_and_cache(inductor_cache, llama):
    """Loops of three lengths (three buffer capacities, spans of one to three blocks, the last block cut by
    max_length) and a context step: within float32's tolerance of the full-prefix path, from one compiled
    program; after the first call, any recompile raises."""
    ids = token_ids(llama.config, 1, 130)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them: tests/test_asv_steps.py's graph would count here
    compiled.compile_seconds.clear()
    with torch._dynamo.config.patch(error_on_recompile=False):
        first = check_equivalence(llama, ids[:, :70], ["static-compiled"])["static-compiled"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        later = [check_equivalence(llama, ids[:, :n], ["static-compiled"])["static-compiled"] for n in (3, 130)]
        context = requests.check_context(llama, ids, ["static-compiled"], 100)["static-compiled"]
    assert all(check.passed and check.max_abs_diff <= 1e-5 for check in (first, *later))
    assert context["passed"]
    assert len(compiled.compile_seconds["static-compiled"]) == 1  # timed once, at the first call
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.compile
def test_hf_static_compiled_passes_the_gate_without_recompiling(inductor_cache, llama):
    """transformers' StaticCache is a fixed shape: one program per cache size (kvbench gives it whole blocks,
    so lengths 40 and 64 share one), none per step."""
    pytest.importorskip("transformers")
    ids = token_ids(llama.config, 1, 64)
    check_equivalence(llama, ids[:, :40], ["hf-static-compiled"])  # the compile
    with torch._dynamo.config.patch(error_on_recompile=True):
        check = check_equivalence(llama, ids, ["hf-static-compiled"])["hf-static-compiled"]
    assert check.passed and check.max_abs_diff <= 1e-5
    assert len(compiled.compile_seconds["hf-static-compiled"]) == 1


def test_a_compiled_mode_is_refused_in_one_line_without_a_compiler(monkeypatch, capsys):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    assert cxx_compiler() is None
    code = main(["run", "--preset", "llama-tiny", "--modes", "full,static-compiled", "--lengths", "8"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "static-compiled needs a C++ compiler" in err


@pytest.mark.parametrize("dtype, family, refusal", [("float16", "llama", "compiles for dtypes"),
                                                     ("float32", "gpt2", "steps the llama family")])
def test_a_compiled_mode_is_refused_for_an_unsupported_dtype_or_family(dtype, family, refusal):
    config = preset_config("llama-tiny" if family == "llama" else "seed", dtype=getattr(torch, dtype))
    with pytest.raises(ValueError, match=refusal):
        require_compiled("static-compiled", config)
