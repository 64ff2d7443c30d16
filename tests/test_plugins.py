"""kvbench.plugins and register_kind: a cache kind of your own runs through the same gate, protocol and record."""

from __future__ import annotations

import json
from pathlib import Path
import sys
import time

import pytest
import torch

from kvbench import modes
from kvbench.cache import KINDS, StaticCache, make_cache, register_kind
from kvbench.cli import main
from kvbench.workloads.decode import check_equivalence, decode, known_modes, token_ids
from kvbench.model import DecoderConfig, build_model
from kvbench.plugins import load_plugin
from kvbench.record import load_record

PLUGIN = """
from kvbench.cache import StaticCache, register_kind

class Mine(StaticCache):
    kind = "mine"

register_kind("mine", Mine)
"""


def test_a_registered_kind_is_a_mode_and_passes_the_gate(clean_kinds):
    class Mine(StaticCache):
        kind = "mine"

    register_kind("mine", Mine)
    assert "mine" in known_modes() and isinstance(make_cache("mine", DecoderConfig()), Mine)
    model = build_model(DecoderConfig(max_length=32))
    result = check_equivalence(model, token_ids(model.config, 1, 12), ["mine"])["mine"]
    assert result.passed and result.max_abs_diff <= 1e-5


@pytest.mark.parametrize("name, factory, message", [
    ("Mine", StaticCache, "plain lowercase word"),
    ("full", StaticCache, "not 'full' or 'control'"),
    ("control", StaticCache, "not 'full' or 'control'"),
    ("static", type("Other", (StaticCache,), {}), "'static' is already registered \\(as StaticCache\\)"),
    ("odd", 42, "must be a subclass of kvbench.cache.Cache, got 42"),
    ("odd", lambda config, batch, capacity: StaticCache(config, batch, capacity), "must be a subclass"),
])
def test_register_kind_refuses_bad_names_and_clashes(clean_kinds, name, factory, message):
    with pytest.raises(ValueError, match=message):
        register_kind(name, factory)
    assert "odd" not in KINDS


def test_load_plugin_records_the_file_and_its_kinds(clean_kinds, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(PLUGIN)
    loaded = load_plugin(path)
    assert loaded["kinds"] == ["mine"] and loaded["path"] == str(path) and len(loaded["sha256"]) == 64


@pytest.mark.parametrize("content, message", [
    ("raise RuntimeError('broken')", "the plugin raised RuntimeError: broken"),
    ("x = 1", "registered no cache kind"),
    ("def (", "the plugin raised SyntaxError"),
])
def test_a_bad_plugin_is_one_line(clean_kinds, tmp_path, content, message):
    path = tmp_path / "bad.py"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_plugin(path)


def test_run_with_a_plugin_kind_and_read_the_record_without_it(clean_kinds, tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text(PLUGIN)
    output = tmp_path / "rec.json"
    code = main(["run", "--plugin", str(path), "--modes", "full,static,mine", "--lengths", "4", "--repeats", "2",
                 "--warmup", "0", "--no-progress", "--output", str(output)])
    assert code == 0, capsys.readouterr().err
    record = load_record(output)
    assert record["run"]["plugins"][0]["kinds"] == ["mine"]
    assert {r["mode"] for r in record["repetitions"]} >= {"mine"}
    KINDS.pop("mine")  # another process, without the plugin: the record still reads
    assert load_record(output)["run"]["modes"] == ["full", "static", "mine"]
    data = json.loads(output.read_text())
    data["run"]["plugins"] = []
    output.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="unknown mode 'mine'"):
        load_record(output)


def test_an_unknown_mode_without_its_plugin_is_one_line(tmp_path, capsys):
    code = main(["run", "--modes", "full,mine", "--lengths", "4", "--no-progress", "--output", str(tmp_path / "r.json")])
    assert code == 2
    assert capsys.readouterr().err == ("kvbench: error: --modes: unknown mode 'mine': expected one of "
                                       "['full', 'concat', 'static', 'paged', 'quantized-int8', 'quantized-int4', "
                                       "'window', 'knorm', 'snapkv', 'tova', 'h2o', 'pyramidkv', 'streamingllm', 'random', "
                                       "'hf-dynamic', 'hf-static', 'hf-quantized-int4', 'hf-quantized-int8', "
                                       "'static-compiled', 'hf-static-compiled']\n")


def test_the_slowed_test_kind_is_exact_and_slower(clean_kinds):
    from pathlib import Path

    load_plugin(Path(__file__).parent / "plugins" / "slowed.py")
    model = build_model(DecoderConfig(max_length=32))
    ids = token_ids(model.config, 1, 16)
    assert check_equivalence(model, ids, ["slowed"])["slowed"].passed
    with torch.inference_mode():
        cache = make_cache("slowed", model.config, capacity=16)
        assert type(cache).__name__ == "SlowedCache"
    # Slower by construction: every append of every layer spins for WAIT_NS of wall time, so a loop of
    # 16 steps lasts at least 16 * layers * WAIT_NS however fast the machine is (a bound, not a timing race).
    wait = sys.modules[KINDS["slowed"].__module__].WAIT_NS
    started = time.perf_counter_ns()
    decode(model, ids, "slowed")
    assert time.perf_counter_ns() - started >= 16 * model.config.layers * wait


HALF = Path(__file__).resolve().parent / "plugins" / "half.py"


def test_the_worked_example_a_kind_of_one_class_and_one_spec_runs_through_the_gate_a_run_and_a_record(
        clean_kinds, tmp_path, capsys):
    """docs/extending.md's example: tests/plugins/half.py registers `half` by one ModeSpec, nothing else."""
    assert load_plugin(HALF)["kinds"] == ["half"]
    half = modes.spec("half")
    assert (half.source, half.exact, KINDS["half"].__name__) == ("plugin", False, "HalfCache")
    model = build_model(DecoderConfig(max_length=32))
    check = check_equivalence(model, token_ids(model.config, 1, 24), ["half"])["half"]
    assert check.passed and not check.exact and 0 < check.max_abs_diff <= half.drift_limits["max_abs_diff"]
    output = tmp_path / "half.json"
    modes.unregister("half")  # `kvbench run` loads the file afresh, as a new process would
    code = main(["run", "--plugin", str(HALF), "--modes", "full,static,half", "--lengths", "8,16", "--repeats", "2",
                 "--warmup", "0", "--no-progress", "--output", str(output)])
    assert code == 0, capsys.readouterr().err
    record = load_record(output)
    memory = {entry["mode"]: entry for entry in record["memory"] if entry["length"] == 16}
    assert memory["half"]["measured_bytes"] == memory["half"]["expected_bytes"] == memory["static"]["measured_bytes"] // 2
    assert {check["mode"]: check["exact"] for check in record["checks"]}["half"] is False
    modes.unregister("half")  # read where the plugin is not loaded: the record still reads and reports
    assert main(["report", str(output)]) == 0 and "half" in capsys.readouterr().out


THINNED = Path(__file__).resolve().parent / "plugins" / "thinned.py"


def test_the_evicting_worked_example_runs_through_every_workload_gated_against_the_full_path_masked_to_what_it_kept(
        clean_kinds, tmp_path, capsys):
    """docs/extending.md's evicting example: tests/plugins/thinned.py, one class (its policy) and one spec."""
    from kvbench.serving import admission
    from kvbench.workloads import quality

    assert load_plugin(THINNED)["kinds"] == ["thinned"]
    thinned = modes.spec("thinned")
    assert (thinned.exact, thinned.evicts, thinned.keeps_every_position) == (True, True, False)
    model = build_model(DecoderConfig(layers=2, max_length=64))
    ids = token_ids(model.config, 1, 40)
    check = check_equivalence(model, ids, ["thinned"])["thinned"]
    assert check.passed and check.exact and check.max_abs_diff < 1e-5
    # The eviction is real: against the unmasked full path its logits are far apart.
    assert (decode(model, ids, "thinned", keep_logits=True) - decode(model, ids, "full", keep_logits=True)).abs().max() > 1e-2
    assert "thinned" in admission.serving_kinds()
    common = ["--plugin", str(THINNED), "--repeats", "1", "--warmup", "0", "--no-progress"]
    for name, workload in (("loop", ["--lengths", "16,32"]), ("request", ["--prompt", "12", "--generate", "8"]),
                           ("contexts", ["--contexts", "16"])):
        modes.unregister("thinned")  # `kvbench run` loads the file afresh, as a new process would
        output = tmp_path / f"{name}.json"
        code = main(["run", *common, "--modes", "full,static,thinned", *workload, "--output", str(output)])
        assert code == 0, (name, capsys.readouterr().err)
        record = load_record(output)
        assert all(check["passed"] for check in record["checks"]), (name, record["checks"])
        if name == "loop":  # the first 8 positions, then the even ones: 8 + 12 of 32, each with its int64 position
            memory = {entry["mode"]: entry for entry in record["memory"] if entry["length"] == 32}
            assert memory["thinned"]["measured_bytes"] == memory["thinned"]["expected_bytes"] == (
                20 * (memory["static"]["measured_bytes"] // 32 + 8))
    served = tmp_path / "served.json"
    modes.unregister("thinned")
    code = main(["run", "--plugin", str(THINNED), "--trace", "fixed:12,6", "--requests", "3", "--modes", "static,thinned",
                 "--repeats", "1", "--max-batched-tokens", "5", "--output", str(served)])
    assert code == 0, capsys.readouterr().err
    checks = {check["mode"]: check for check in json.loads(served.read_text())["checks"]}
    assert checks["thinned"]["passed"] and checks["thinned"]["tokens_checked"] == 18
    llama = build_model(DecoderConfig(family="llama", layers=2, vocab_size=96, max_length=64, heads=4, kv_heads=2),
                        seed=1)
    text = torch.randint(0, 96, (1, 2 * 24), generator=torch.Generator().manual_seed(2))
    rows = {row["mode"]: row for row in quality.measure(llama, text, ["full", "thinned"], Digits(), chunks=2, prompt=6,
                                                        generate=6)["modes"]}
    assert rows["thinned"]["kl_mean"] > 0 and "window" not in rows["thinned"]  # measured on the full model
    assert 0 < rows["thinned"]["top1_agreement"] <= 1


class Digits:
    """A stand-in tokenizer for the quality workload: ids as text."""

    def decode(self, ids):
        return " ".join(str(i) for i in ids)


def test_a_kind_is_served_and_given_options_by_its_spec_not_its_name(clean_kinds):
    """The command line gives a kind the cache options its spec takes, and admission reserves by its spec."""
    from argparse import Namespace

    from kvbench.cli.usage import cache_options, option_readers
    from kvbench.serving import admission

    modes.register(modes.ModeSpec("grouped", modes.PLUGIN, cache=StaticCache, options=("group_size",),
                                  bytes=lambda config, batch, length, **options: 3 * length, serving=modes.RESERVE))
    args = Namespace(quant_group=4, quant_residual=3)
    assert cache_options(args, "grouped") == {"group_size": 4}
    assert cache_options(args, "quantized-int8") == {"group_size": 4, "residual": 3}
    assert cache_options(args, "static") == {} and cache_options(args, admission.PEER) == {}
    assert option_readers(["static", "grouped"]) == {"--quant-group": ["grouped"], "--quant-residual": [],
                                                      "--evict-ratio": [], "--kv-keep": [], "--evict-every": []}
    config = DecoderConfig()
    assert admission.reservation("grouped", config, 10) == 30  # its formula at the capacity
    assert admission.reservation("static", config, 10) == 2 * 4 * 10 * 8 * 4
    assert "grouped" in admission.serving_kinds() and not admission.holds_pages("grouped")
    assert admission.holds_pages("paged") and admission.holds_pages(admission.PEER)
    with pytest.raises(ValueError, match=r"a reserving kind is one of static, .*grouped; got 'paged'"):
        admission.reservation("paged", config, 10)
    with pytest.raises(ValueError, match="serving is one of"):
        modes.ModeSpec("odd", modes.PLUGIN, serving="lease")
    with pytest.raises(ValueError, match="evicts: expected keeps_every_position=False"):
        modes.ModeSpec("odd", modes.PLUGIN, evicts=True)
