"""kvbench.cli: one-line errors with exit 2, never overwriting, and a real run end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvbench.models.gguf as kvgguf
import kvbench.workloads.decode as decode_module
from kvbench.measure import timing
from kvbench.cache import ConcatCache
from kvbench.cli import build_parser, main, options, usage
from kvbench.cli.run import check_run
from kvbench.report.format import ms
from kvbench.record import RECORD_SCHEMA, load_record
from kvbench.serving.trace import make_trace, parse_arrivals, parse_lengths

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--modes", "full,concat", "--repeats", "2", "--warmup", "0", "--no-progress"]


def run_main(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), err
    assert lines[0].startswith("kvbench: error: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0]


def medians_ms(record):
    """Median milliseconds of every timed mode (the A/A control is summarised below the table, not in it)."""
    return {(c["mode"], c["length"]): ms(c["median"]) for c in record["summary"]["cells"] if c["mode"] != "control"}


@pytest.fixture
def restore_threads():
    intra = torch.get_num_threads()
    yield
    torch.set_num_threads(intra)


# -- user errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--lengths", "abc"], "'abc'"),
        (["--lengths", "0"], "'0'"),
        (["--lengths", "-3"], "'-3'"),
        (["--lengths", "4,4"], "distinct"),
        (["--lengths", "4,,8"], "positive integers"),
        (["--repeats", "0"], "--repeats"),
        (["--repeats", "x"], "'x'"),
        (["--warmup", "-1"], "--warmup"),
        (["--lengths", "999999"], "999999 exceeds max_length"),
        (["--lengths", "8", "--max-length", "4"], "8 exceeds max_length 4"),
        (["--lengths", "4", "--per-step", "5000"], "5000 exceeds max_length"),
        (["--modes", "bogus"], "'bogus'"),
        (["--modes", "full,full"], "distinct"),
        (["--threads", "0"], "--threads"),
        (["--heads", "5"], "heads must divide width"),
        (["--kv-heads", "3"], "kv_heads must divide heads"),
        (["--dtype", "int4"], "--dtype"),
        (["--preset", "huge"], "--preset"),
        (["--preset", "gemma-tiny", "--heads", "3"], "kv_heads must divide heads"),
        (["--preset", "llama-tiny", "--window-pattern", "alternating"], "needs a sliding window"),
        (["--preset", "llama-3.1-8b", "--lengths", "16", "--dtype", "float32"],
         ("preset 'llama-3.1-8b' (8.03B parameters, 29.9 GiB of float32 weights)",
          "but 1.0 GiB of memory is available")),
        (["--frobnicate"], "unrecognized arguments"),
        (["--prompt", "2000", "--generate", "100"], "--prompt 2000 + --generate 100 holds 2099 positions, beyond "
                                                    "max_length 2048 of preset 'seed'"),
        (["--prompt", "64"], "a request needs both --prompt P (tokens prefilled) and --generate N"),
        (["--generate", "0"], "--generate"),
        (["--prompt", "8", "--generate", "4", "--lengths", "16"], "--lengths and --prompt/--generate choose different"),
        (["--contexts", "64", "--lengths", "16"], "--lengths and --contexts choose different workloads"),
        (["--contexts", "2040"], "--contexts 2040: 4 warm-up and 16 timed steps after 2040 tokens need 2060 positions, "
                                "beyond max_length"),
        (["--contexts", "64", "--per-step", "8"], "--per-step is not used by a contexts run (--contexts), only by "
                                                  "loop runs"),
    ],
)
def test_run_user_errors_are_one_line_exit_2(capsys, tmp_path, monkeypatch, args, fragment):
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "1GiB")  # a refusal for want of memory holds on any machine
    output = tmp_path / "rec.json"
    code, out, err = run_main(capsys, "run", *args, "--output", output, "--no-progress")
    assert_one_line_error(code, err, *(fragment if isinstance(fragment, tuple) else (fragment,)))
    assert out == ""
    assert not output.exists()


# -- an option the workload does not use ------------------------------------------------------------------------


class Measured(Exception):
    """Where a run would start its work: a refusal must come first (and a combination let through by mistake ends
    here at once instead of measuring)."""


@pytest.fixture
def nothing_measured(monkeypatch):
    def measure(*_):
        raise Measured()

    monkeypatch.setattr(timing, "set_threads", measure)  # the first step of either run after check_run


@pytest.fixture(scope="module")
def saved_trace(tmp_path_factory) -> Path:
    """A trace file to replay: 3 requests of 8 prompt tokens (2 of them a shared prefix) and 4 output tokens."""
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    spec = {**parse_lengths("fixed:8,4"), **parse_arrivals("all"), "requests": 3, "prefix": 2}
    path.write_text(json.dumps(make_trace(spec, 0, 64).to_dict()))
    return path


@pytest.mark.parametrize("args, fragment", [
    (["--trace", "chat", "--model", "smollm2-135m", "--quality", "8"],  # a served model is timed, not scored on text
     "--quality is not used by a serving run (--trace LENGTHS), only by loop, request and contexts runs"),
    (["--trace", "chat", "--gguf", "missing.gguf"], "--gguf: expected a GGUF file, got missing.gguf: no such regular"),
    (["--trace", "chat", "--model", "smollm2-135m", "--width", "64"],  # the file's shapes, not the preset's
     "--model fixes the model's shapes: it cannot be combined with --width"),
    (["--trace", "chat", "--plugin", "missing.py"], "missing.py: no such file"),  # a plugin's kind may be served
    (["--trace", "chat", "--lengths", "8"], "--lengths and --trace choose different workloads: give one of them"),
    (["--trace", "chat", "--warmup", "1", "--batch", "1"],  # the defaults' values, given all the same
     "--warmup, --batch are not used by a serving run (--trace LENGTHS): leave them out"),
    (["--trace", "fixed:8,4", "--modes", "full,concat,static,paged"],  # run's default modes, given: not serving's
     "--modes full: a serving run takes kinds"),
    (["--trace", "{trace}", "--requests", "4"], "--requests is not used by a replay run (--trace FILE or SHAPE), only by serving"),
    (["--trace", "fixed:8,4", "--share-prefix"],
     "--share-prefix: no request of the trace carries a shared prefix to share (--prefix S draws one)"),
    (["--trace", "fixed:8,4", "--prefix-fraction", "0.5"],
     "--prefix-fraction needs --prefix in a serving run: it is the share of requests that carry the prefix"),
    (["--trace", "fixed:8,4", "--cancel", "0.5:4"], "--cancel 0.5:4: K must be below a request's output, and 4 tokens "
                                                    "is at or beyond every one (the longest is 4)"),
    (["--trace", "fixed:8,4", "--cancel", "1:5"],
     "--cancel 1:5: F, the fraction of the requests cancelled, must be in (0, 1), got '1'"),
    (["--trace", "fixed:8,4", "--max-seconds", "30"],
     "--max-seconds needs --precision or --rate-sweep or --capacity in a serving run"),
    (["--trace", "fixed:8,4", "--kv-budget", "1e30"], "--kv-budget 1e30: 1e+30 bytes of KV caches and 338.4 KiB of "
                                                      "weights need more than the 1.0 GiB of memory available"),
    (["--trace", "fixed:8,4", "--kv-budget", "2GiB"], "--kv-budget 2GiB: 2.0 GiB of KV caches and 338.4 KiB"),
    (["--trace", "fixed:8,4", "--modes", "static", "--block-size", "8"],
     "--block-size is read by paged and hf-continuous only, and --modes static runs none of them"),
    (["--quant-group", "16"], "--quant-group is read by the quantized kinds only, and --modes full,concat,static,paged "
                              "runs none of them"),
    (["--contexts", "8", "--min-repeats", "3", "--per-step", "8"], "--per-step is not used by a contexts run"),
    (["--quality", "8"], "--quality needs --model or --gguf in a loop run: it measures a trained model on text"),
    (["--needle", "64"], "--needle needs --model or --gguf in a loop run: it measures a trained model's retrieval"),
    (["--needle-depths", "0,150"], "--needle-depths: expected comma-separated depths in [0, 100] (percent of the "
                                   "context), got '150' in '0,150'"),
    (["--needle-ratios", "0.5,1"], "--needle-ratios: expected comma-separated fractions in [0, 1) such as "
                                   "0.25,0.5,0.75, got '1' in '0.5,1'"),
])
def test_an_option_the_run_does_not_use_is_one_line_before_measuring(capsys, tmp_path, monkeypatch, saved_trace,
                                                                      nothing_measured, args, fragment):
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "1GiB")
    output = tmp_path / "rec.json"
    argv = [str(saved_trace) if arg == "{trace}" else arg for arg in args]
    code, out, err = run_main(capsys, "run", *argv, "--output", output)
    assert_one_line_error(code, err, fragment)
    assert out == "" and not output.exists()


def test_save_trace_and_output_must_be_different_files_and_neither_the_trace_replayed(capsys, tmp_path, saved_trace,
                                                                                      nothing_measured):
    same = tmp_path / "same.json"
    code, _, err = run_main(capsys, "run", "--trace", "fixed:8,4", "--save-trace", same, "--output", same)
    assert_one_line_error(code, err, f"--save-trace and --output both name {same}: the trace and the record need "
                                     "different files")
    code, _, err = run_main(capsys, "run", "--trace", saved_trace, "--save-trace", saved_trace, "--force")
    assert_one_line_error(code, err, f"--save-trace {saved_trace} is the record being read")
    assert not same.exists() and json.loads(saved_trace.read_text())["requests"]


# Every option of `run` with a value that each workload using it accepts (with what it needs beside it); the
# workloads' own options. A new option fails the test below until it has a sample here and a row in USED_BY.
SAMPLES = {
    "--lengths": ["--lengths", "8"], "--prompt": ["--prompt", "8"], "--generate": ["--generate", "4"],
    "--contexts": ["--contexts", "8"], "--trace": ["--trace", "fixed:8,4"], "--modes": ["--modes", "static,paged"],
    "--plugin": ["--plugin", str(ROOT / "tests" / "plugins" / "half.py")], "--repeats": ["--repeats", "2"],
    "--precision": ["--precision", "0.1"], "--min-repeats": ["--min-repeats", "3"],
    "--max-repeats": ["--max-repeats", "50", "--precision", "0.1"],
    "--max-seconds": ["--max-seconds", "10", "--precision", "0.1"], "--between-run": ["--between-run", "0.005"],
    "--order": ["--order", "rotate"], "--cpu": ["--cpu", "auto"], "--control": ["--control", "none"],
    "--warmup": ["--warmup", "0"], "--batch": ["--batch", "2"], "--seed": ["--seed", "3"],
    "--threads": ["--threads", "1"], "--device": ["--device", "cpu"],
    "--quality": ["--quality", "8", "--model", "smollm2-135m"],
    "--needle": ["--needle", "64", "--model", "smollm2-135m"],
    "--needle-depths": ["--needle-depths", "0,50", "--needle", "64", "--model", "smollm2-135m"],
    "--needle-ratios": ["--needle-ratios", "0.25,0.5", "--needle", "64", "--model", "smollm2-135m", "--plugin",
                        str(ROOT / "tests" / "plugins" / "oldest.py"), "--modes", "full,oldest"],
    "--per-step": ["--per-step", "8"], "--output": ["--output", "{out}/rec.json"], "--force": ["--force"],
    "--no-progress": ["--no-progress"], "--wide": ["--wide"], "--requests": ["--requests", "3"],
    "--arrivals": ["--arrivals", "poisson:5"], "--prefix": ["--prefix", "2"], "--prefix-fraction": ["--prefix-fraction",
                                                                                                   "0.5"],
    "--share-prefix": ["--share-prefix"], "--cancel": ["--cancel", "0.5:2"], "--kv-budget": ["--kv-budget", "1MiB"],
    "--reserve": ["--reserve", "max-length"], "--block-size": ["--block-size", "8"],
    "--max-batched-tokens": ["--max-batched-tokens", "none"], "--save-trace": ["--save-trace", "{out}/trace.json"],
    "--prefix-cache": ["--prefix-cache"], "--queue-order": ["--queue-order", "longest-prefix", "--prefix-cache"],
    "--rate-sweep": ["--rate-sweep", "1,2"], "--capacity": ["--capacity", "--slo", "ttft_p99=100"],
    "--slo": ["--slo", "tbt_p99=5x", "--rate-sweep", "1"],
    "--preset": ["--preset", "llama-tiny"], "--width": ["--width", "64"], "--heads": ["--heads", "2"],
    "--kv-heads": ["--kv-heads", "2"], "--layers": ["--layers", "2"], "--vocab-size": ["--vocab-size", "64"],
    "--max-length": ["--max-length", "64"], "--dtype": ["--dtype", "float64"], "--window": ["--window", "4"],
    "--sinks": ["--sinks", "1", "--window", "4"], "--model": ["--model", "smollm2-135m"],
    "--gguf": ["--gguf", "{packaged}"], "--window-pattern": ["--window-pattern", "all", "--window", "4"],
    "--quant-group": ["--quant-group", "16", "--modes", "quantized-int8"],
    "--quant-residual": ["--quant-residual", "64", "--modes", "quantized-int8"],
    "--evict-ratio": ["--evict-ratio", "0.25", "--modes", "knorm"], "--kv-keep": ["--kv-keep", "6", "--modes", "tova"],
    "--evict-every": ["--evict-every", "2", "--modes", "h2o"],
}
BASES = {"loop": ["--lengths", "8"], "request": ["--prompt", "8", "--generate", "4"], "contexts": ["--contexts", "8"],
         "serving": ["--trace", "fixed:8,4", "--prefix", "2"], "replay": ["--trace", "{trace}"]}
RUN_OPTIONS = [action.option_strings[-1] for action in options.run_parser().actions() if action.dest != "help"]
REAL_MODEL = ("--model", "--gguf", "--quality", "--needle", "--needle-depths", "--needle-ratios")


def test_every_run_option_says_which_workloads_use_it():
    assert sorted(usage.USED_BY) == sorted(RUN_OPTIONS)
    assert sorted(BASES) == sorted(usage.WORKLOADS)
    assert set(usage.NEEDS) | set(usage.KIND_OPTIONS) <= set(RUN_OPTIONS)


@pytest.mark.parametrize("workload", list(usage.WORKLOADS))
@pytest.mark.parametrize("option", RUN_OPTIONS)
def test_every_run_option_is_checked_by_a_workload_that_uses_it_and_refused_by_the_others(
        option, workload, capsys, tmp_path, monkeypatch, saved_trace, nothing_measured, clean_kinds):
    """Each option with each workload: where the workload uses it, every check passes (check_run, torch-free,
    nothing written); where not, one line naming it, before anything is measured."""
    assert option in SAMPLES, f"give {option} a sample value in SAMPLES and a row in kvbench.cli.usage.USED_BY"
    if option in REAL_MODEL and workload in usage.USED_BY[option]:
        try:
            packaged = kvgguf.packaged_path("smollm2-135m")
            kvgguf.require_gguf()
        except ValueError as error:
            pytest.skip(str(error))  # the file is read once per test process (tests/conftest.py, gguf_read_once)
    else:
        packaged = tmp_path / "model.gguf"  # never read: the option is refused first
    fill = {"{trace}": str(saved_trace), "{packaged}": str(packaged)}
    argv = [fill.get(arg, arg).replace("{out}", str(tmp_path / "out")) for arg in [*BASES[workload], *SAMPLES[option]]]
    if workload in usage.USED_BY[option]:
        args = build_parser().parse_args(["run", *argv])
        args.argv = ["run", *argv]
        check_run(args)
        assert not (tmp_path / "out").exists()  # checked, not written
    else:
        code, out, err = run_main(capsys, "run", *argv)
        assert_one_line_error(code, err, option)
        assert f"not used by a {workload} run" in err or "choose different workloads" in err
        assert out == "" and not (tmp_path / "out").exists()


def test_no_command_is_one_line_exit_2(capsys):
    code, _, err = run_main(capsys)
    assert_one_line_error(code, err, "required")


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "--preset", "llama-mni"], "run: argument --preset: invalid choice: 'llama-mni'; did you mean 'llama-mini'?"),
        (["run", "--lenghts", "4"], "unrecognized arguments: --lenghts 4; did you mean '--lengths'?"),
        (["budget", "--dtype", "flot16"], "did you mean 'float16'?"),
        (["run", "--modes", "full,statc", "--no-progress"], "--modes: unknown mode 'statc': expected one of"),
        (["run", "--modes", "full,statc", "--no-progress"], "'hf-static-compiled']; did you mean 'static'?"),
        (["run", "--trace", "chat", "--modes", "pagd"], "a serving run takes kinds ['static', 'paged', "
                                                          "'quantized-int8', 'quantized-int4', 'knorm', 'snapkv', 'tova', "
                                                          "'h2o', 'pyramidkv', 'streamingllm', 'random', 'hf-continuous']; "
                                                          "did you mean 'paged'?"),
    ],
)
def test_a_typo_names_the_closest_choice_and_the_prefix_is_said_once(capsys, argv, expected):
    code, _, err = run_main(capsys, *argv)
    assert_one_line_error(code, err, expected)
    assert err.count("kvbench") == 1  # "kvbench: error:" and no second "kvbench run:"


def test_run_help_names_the_default_modes_and_the_rerun_interval(capsys):
    with pytest.raises(SystemExit):
        run_main(capsys, "run", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: full,concat,static,paged; a serving run's: static,paged)" in text
    assert "all modes" not in text and "95% rerun interval of every speedup" in text
    assert "speedup's 95% rerun interval (default: 0.05)" in text and "95% interval" not in text


def test_a_word_close_to_nothing_gets_no_suggestion(capsys):
    code, _, err = run_main(capsys, "run", "--frobnicate")
    assert_one_line_error(code, err, "unrecognized arguments: --frobnicate")
    assert "did you mean" not in err


def test_unknown_command_is_one_line_exit_2(capsys):
    code, _, err = run_main(capsys, "frobnicate")
    assert_one_line_error(code, err, "frobnicate")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "no such file"),
        ("", "not valid JSON"),
        ('{"schema": "kvbench.record/1", "status": "comp', "not valid JSON"),
        ('{"name": "package.json", "version": "1.0"}', "not a kvbench record"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"schema": "kvbench.record/9"}', "unsupported schema version"),
    ],
)
def test_show_bad_files_are_one_line_exit_2(capsys, tmp_path, content, fragment):
    path = tmp_path / "rec.json"
    if content is not None:
        path.write_text(content)
    code, out, err = run_main(capsys, "show", path)
    assert_one_line_error(code, err, fragment, str(path))
    assert out == ""


def test_show_directory_is_one_line_exit_2(capsys, tmp_path):
    code, _, err = run_main(capsys, "show", tmp_path)
    assert_one_line_error(code, err, str(tmp_path))


def test_existing_output_is_not_overwritten(capsys, tmp_path):
    output = tmp_path / "rec.json"
    output.write_text("precious")
    code, out, err = run_main(capsys, "run", "--lengths", "4", *QUICK, "--output", output)
    assert_one_line_error(code, err, "already exists", "--force")
    assert output.read_text() == "precious"
    assert os.listdir(tmp_path) == ["rec.json"]


# -- successful runs ------------------------------------------------------------------------


def test_run_then_show(capsys, tmp_path, restore_threads):
    output = tmp_path / "out" / "rec.json"
    code, out, err = run_main(capsys, "run", "--lengths", "4,8", "--modes", "full,concat", "--repeats", "2",
                              "--output", output, "--no-progress")
    assert code == 0, err
    assert err == ""
    assert f"record: {output}" in out.splitlines()[-1]

    record = load_record(output)
    assert set(RECORD_SCHEMA["required"]) <= set(record)
    assert record["status"] == "complete"
    assert record["run"]["lengths"] == [4, 8] and record["run"]["modes"] == ["full", "concat"]
    assert record["run"]["repeats"] == 2 and record["protocol"]["repeats"] == 2
    assert record["protocol"]["threads_in_effect"]["intra_op"] == 1
    assert record["config"]["width"] == 32 and record["config"]["dtype"] == "float32"
    assert len(record["repetitions"]) == 2 * 3 * 2  # lengths x (full, concat, the A/A control) x rotations
    assert record["run"]["control"] == "concat"
    assert len(record["checks"]) == 4 and all(c["passed"] for c in record["checks"])
    assert all(m["expected_bytes"] == m["measured_bytes"] for m in record["memory"])
    assert {"python", "torch", "cpu"} <= set(record["environment"])
    assert os.listdir(output.parent) == ["rec.json"]

    table_lines = [line for line in out.splitlines() if "│" in line]
    rows = [line for line in table_lines if " full " in line or " concat " in line]
    assert len(rows) == 4
    for (mode, length), median in medians_ms(record).items():
        assert any(f" {mode} " in row and f" {median} " in row for row in rows), (mode, length, median)
    assert any(" 4 " in row for row in rows) and any(" 8 " in row for row in rows)

    code, shown, err = run_main(capsys, "show", output)
    assert code == 0 and err == ""
    # show prints the very table run printed: same medians, same everything.
    assert shown.splitlines() == out.splitlines()[:-1]


def test_a_llama_preset_runs_every_exact_kind_and_its_record_holds_the_family(capsys, tmp_path, restore_threads):
    """gemma-tiny: rotated keys, windows on every other layer, a head width that is not width / heads."""
    output = tmp_path / "rec.json"
    code, out, err = run_main(capsys, "run", "--preset", "gemma-tiny", "--window", "6", "--lengths", "4,10",
                              "--modes", "full,static,paged,window,quantized-int8", "--repeats", "1",
                              "--control", "none", "--output", output, "--no-progress")
    assert code == 0, err
    record = load_record(output)
    config = record["config"]
    assert (config["family"], config["window"], config["window_pattern"], config["head_dim"]) == ("llama", 6,
                                                                                                  "alternating", 16)
    assert config["tie_embeddings"] is True and config["rope_theta"] == 10000.0
    assert all(check["passed"] for check in record["checks"])
    window = {m["length"]: m["measured_bytes"] for m in record["memory"] if m["mode"] == "window"}
    per_position = 2 * 2 * 16 * 4  # k and v, 2 KV heads of 16, float32, one layer
    assert window == {4: 4 * 4 * per_position, 10: (6 + 10 + 6 + 10) * per_position}
    code, shown, _ = run_main(capsys, "report", output)
    assert code == 0 and "gemma-tiny" in shown


@pytest.fixture(scope="module")
def forced_run(tmp_path_factory):
    """One quick run with --force over an existing file: (argv, exit status, the folder) for the two tests below."""
    folder = tmp_path_factory.mktemp("forced")
    output = folder / "rec.json"
    output.write_text("old")
    argv = ["run", "--lengths", "4", *QUICK, "--output", str(output), "--force"]
    threads = torch.get_num_threads()
    try:
        code = main(argv)
    finally:
        torch.set_num_threads(threads)
    return argv, code, folder


def test_force_replaces_existing_output(forced_run):
    _, code, folder = forced_run
    assert code == 0
    assert load_record(folder / "rec.json")["run"]["lengths"] == [4]
    assert os.listdir(folder) == ["rec.json"]


def test_record_command_is_the_argv_given_to_main(forced_run):
    argv, code, folder = forced_run
    assert code == 0
    assert load_record(folder / "rec.json")["command"][-len(argv):] == argv


class CorruptingCache(ConcatCache):
    def update(self, layer, k, v):
        if self.length >= 2:
            v = v + 1.0
        return super().update(layer, k, v)


def break_concat(monkeypatch, cache_class):
    real_make_cache = decode_module.make_cache

    def make_cache(kind, config, batch=1, capacity=None, **options):
        if kind == "concat":
            return cache_class(config, batch, capacity)
        return real_make_cache(kind, config, batch, capacity, **options)

    monkeypatch.setattr(decode_module, "make_cache", make_cache)


def test_failed_equivalence_exits_1_and_is_recorded_invalid(capsys, tmp_path, monkeypatch, restore_threads):
    break_concat(monkeypatch, CorruptingCache)
    output = tmp_path / "rec.json"
    code, out, err = run_main(capsys, "run", "--lengths", "4", *QUICK, "--output", output)
    assert code == 1
    assert "EQUIVALENCE FAILED" in err and "concat at length 4" in err and "position 2" in err
    assert "FAILED" in out and "invalid" in out
    record = load_record(output)
    (check,) = [c for c in record["checks"] if c["mode"] == "concat"]
    assert check["passed"] is False and check["first_divergent_position"] == 2
    # concat's speedup is invalid, and so is its A/A twin's: the control times the same broken cache
    assert {s["mode"]: s["valid"] for s in record["summary"]["speedups"]} == {"concat": False, "control": False}


class NaNCache(ConcatCache):
    def update(self, layer, k, v):
        if self.length >= 2:
            v = torch.full_like(v, float("nan"))
        return super().update(layer, k, v)


def test_nan_logits_are_reported_as_a_failed_check(capsys, tmp_path, monkeypatch, restore_threads):
    break_concat(monkeypatch, NaNCache)
    output = tmp_path / "rec.json"
    code, out, err = run_main(capsys, "run", "--lengths", "4", *QUICK, "--output", output)
    assert code == 1, err
    assert load_record(output)["checks"][1]["first_divergent_position"] == 2


def test_env_prints_json(capsys):
    code, out, err = run_main(capsys, "env")
    assert code == 0
    env = json.loads(out)
    assert {"python", "torch", "cpu"} <= set(env)
    assert env["python"]["version"].startswith(f"{sys.version_info.major}.{sys.version_info.minor}")
    assert env["torch"]["version"] == torch.__version__


@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_subprocess_run_end_to_end(tmp_path):
    output = tmp_path / "rec.json"
    command = [sys.executable, "-m", "kvbench", "run", "--lengths", "4", "--modes", "full,static",
               "--repeats", "2", "--output", str(output), "--no-progress", "--wide"]  # every column, whatever $COLUMNS
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"record: {output}" in done.stdout
    record = load_record(output)
    assert record["protocol"]["threads_in_effect"] == {"requested": 1, "intra_op": 1, "inter_op": 1}
    assert "run" in record["command"] and "--lengths" in record["command"]
    for (mode, length), median in medians_ms(record).items():
        assert any(f" {mode} " in line and f" {median} " in line for line in done.stdout.splitlines())


# -- cheap commands stay cheap --------------------------------------------------------------

IMPORTS_PROBE = """
import json, sys
from kvbench.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exit:  # --help
    status = exit.code
heavy = sorted({name.split(".")[0] for name in sys.modules} & {"torch", "scipy", "matplotlib", "transformers"})
print(json.dumps({"status": status, "heavy": heavy}), file=sys.stderr)
"""


def imported_by(*argv: str) -> tuple[int, list[str]]:
    """Run the CLI in a fresh interpreter; (exit status, the heavy packages it imported)."""
    done = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    outcome = json.loads(done.stderr.splitlines()[-1])
    return outcome["status"], outcome["heavy"]


@pytest.mark.parametrize("argv, status", [
    (["--help"], 0),
    (["run", "--help"], 0),
    (["run", "--output", "/proc/x.json"], 2),
    (["run", "--lengths", "4096"], 2),
    (["run", "--modes", "full,nosuch"], 2),
    (["run", "--modes", "window"], 2),
    (["run", "--prompt", "4000", "--generate", "200"], 2),
    (["run", "--contexts", "9000"], 2),
    (["run", "--device", "tpu", "--lengths", "16"], 2),  # and --device cuda where the machine shows no GPU
    (["run", "--layers", "100000", "--width", "4096", "--heads", "32", "--lengths", "16"], 2),
    (["show", "/dev/null"], 2),
    (["compare", "/dev/null", "results/reference.json"], 2),
    (["budget", "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--tokens", "8192", "--memory", "80GiB"], 0),
    (["budget", "--preset", "llama-3.1-8b", "--dtype", "bfloat16", "--tokens", "8192", "--memory", "80GiB"], 0),
    (["run", "--preset", "llama-3.1-8b", "--lengths", "16"], 2),
    (["run", "--trace", "chat", "--model", "smollm2-135m", "--kv-budget", "2GiB"], 2),  # the budget does not fit
    (["run", "--trace", "fixed:8,4", "--kv-budget", "1e30"], 2),
    (["compare", "results/reference.json", "results/reference.json"], 0),
], ids=lambda value: " ".join(value) if isinstance(value, list) else str(value))
@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_help_argument_checks_refusals_budget_and_compare_import_no_torch_scipy_or_matplotlib(argv, status,
                                                                                               monkeypatch):
    """What a user meets first answers at once: counted in modules, not timed, so it holds on any machine
    (its memory is stated: llama-3.1-8b is refused under 1 GiB however much the machine has)."""
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "1GiB")
    assert imported_by(*argv) == (status, [])


@pytest.mark.parametrize("fmt", ["bmf", "conbench", "github-action-benchmark", "pytest-benchmark"])
@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_export_imports_no_torch_scipy_or_matplotlib(tmp_path, fmt):
    """Publishing a record is reading it: numbers only."""
    output = tmp_path / "out.json"
    repository = ["--repository", "https://github.com/example/kvbench"] if fmt == "conbench" else []
    assert imported_by("export", "results/reference.json", "--format", fmt, "--output", str(output), *repository) \
        == (0, [])
    assert output.is_file()


@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
@pytest.mark.parametrize("results", ["results/history/asv", "results/serving"])  # asv's results, or records
def test_history_imports_no_torch_scipy_or_matplotlib(tmp_path, results):
    output = tmp_path / "history.html"
    assert imported_by("history", results, "--output", str(output)) == (0, [])
    assert output.is_file()


@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_reading_a_record_imports_no_torch_and_no_matplotlib_without_a_plot(tmp_path):
    """show and report read numbers only; scipy is theirs for the trend test and the scaling fit."""
    status, heavy = imported_by("show", "results/reference.json")
    assert status == 0 and "torch" not in heavy and "matplotlib" not in heavy
    status, heavy = imported_by("report", "results/reference.json", "--format", "markdown")
    assert status == 0 and "torch" not in heavy and "matplotlib" not in heavy
    status, heavy = imported_by("report", "results/reference.json", "--plot", str(tmp_path / "plot.svg"))
    assert status == 0 and "matplotlib" in heavy and "torch" not in heavy


def test_memory_refusals_follow_the_stated_limit(capsys, tmp_path, monkeypatch):
    """The seed's tiny run fits on any machine, but not in a stated 64 KiB; a limit that is no size is one line."""
    output = tmp_path / "rec.json"
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "64KiB")
    code, _, err = run_main(capsys, "run", "--lengths", "4", "--output", output, "--no-progress")
    assert_one_line_error(code, err, "preset 'seed' (86.6K parameters, 338.4 KiB of float32 weights)",
                          "but 64.0 KiB of memory is available")
    monkeypatch.setenv("KVBENCH_AVAILABLE_MEMORY", "plenty")
    code, _, err = run_main(capsys, "run", "--lengths", "4", "--output", output, "--no-progress")
    assert_one_line_error(code, err, "KVBENCH_AVAILABLE_MEMORY: expected a size like 24GiB, 80GB or 1e9, got 'plenty'")
    assert not output.exists()
