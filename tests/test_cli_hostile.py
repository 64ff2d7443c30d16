"""What a hostile or careless user does to kvbench, done the way a user does it.

Every test here runs the real command line in a subprocess, with real files (FIFOs,
devices, names too long for the filesystem, paths under a regular file, /proc) and real
signals. Where a signal must land in one particular phase, the child sends it to itself
from inside that phase (a one-line wrapper around the library function that starts the
phase), so the test never depends on how fast this machine is.

The promise under test (docs/cli.md, "When things go wrong"): a bad input ends with exit status
2 and one line naming the problem, before any measurement; SIGINT and SIGTERM end a run
with everything completed saved and marked incomplete (130 / 143); nothing that is not a
regular file is ever replaced; no temporary file is left behind; every message tells the
truth about what is on disk.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from machine_stubs import CHILD

from kvbench.record import load_record

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--lengths", "4,8", "--modes", "full,concat", "--repeats", "2", "--warmup", "0", "--no-progress"]
SLOW = ["--lengths", "256,512", "--repeats", "200", "--no-progress"]  # minutes: only a refusal ends it fast


def kvbench_command(*args) -> list[str]:
    """`python -m kvbench ARGS` with the tests' probe and capture installed first (tests/machine_stubs.py, as the
    autouse fixture does in this process): each child paid about 0.7 s of CPU for the real ones."""
    start = f"{CHILD}(); import runpy; runpy.run_module('kvbench', run_name='__main__', alter_sys=True)"
    return [sys.executable, "-c", start, *map(str, args)]


def kvbench(*args, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(kvbench_command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def with_signal_in(target: str, *args, cwd: Path, signals=(signal.SIGTERM,), after: int = 1, storm: float = 0.0):
    """Run kvbench in a child that sends itself `signals` when `target` ("module:function") is
    entered for the `after`-th time; the function then carries on as if nothing happened.
    With `storm`, a thread then keeps sending SIGINT and SIGTERM every 5 ms for that many seconds,
    so that later signals land in every phase of ending the command."""
    module, function = target.split(":")
    real_capture = module == "kvbench.measure.capture"  # a signal in the capture: the capture itself runs
    script = textwrap.dedent(f"""
        import os, sys, time, importlib, signal, threading
        {CHILD}(capture_too={not real_capture!r})
        sys.argv = ["kvbench", *{[str(a) for a in args]!r}]
        module = importlib.import_module({module!r})
        real, calls = getattr(module, {function!r}), []
        def storm():
            end = time.monotonic() + {storm!r}
            while time.monotonic() < end:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    os.kill(os.getpid(), signum)
                    time.sleep(0.005)
        def wrapper(*a, **k):
            calls.append(1)
            if len(calls) == {after}:
                if {storm!r}:
                    threading.Thread(target=storm, daemon=True).start()
                for signum in {[int(s) for s in signals]!r}:
                    os.kill(os.getpid(), signum)
            return real(*a, **k)
        setattr(module, {function!r}, wrapper)
        from kvbench.cli import main
        raise SystemExit(main())
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def in_process(capsys, monkeypatch):
    """The command line run in this process (kvbench.cli.main, from `cwd`), answered as `kvbench` answers: exit
    status, stdout, stderr. For refusals, which end before anything is measured: a subprocess would pay Python's and
    torch's start for each. The real process's exit status, its one line and no traceback are tested below by the
    tests that keep `kvbench` (an existing output, a FIFO, a memory limit, every signal)."""
    from kvbench.cli import main

    def run(*args, cwd: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return subprocess.CompletedProcess(["kvbench", *map(str, args)], code, out, err)

    return run


def one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvbench: error: "), done.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def no_temporaries(directory: Path) -> None:
    assert [p.name for p in directory.rglob(".*.tmp")] == []


# --- 1. output paths are checked before any measurement ----------------------------------------------


@pytest.mark.parametrize("make_path, fragment", [
    (lambda tmp: tmp / "file.txt" / "rec.json", "is a regular file, not a directory"),
    (lambda tmp: tmp / ("x" * 300 + ".json"), "name too long: 305 bytes, the filesystem allows 255"),
    (lambda tmp: tmp, "already exists and is a directory"),
    (lambda tmp: Path("/proc/kvbench-record.json"), "cannot write in /proc"),
], ids=["under a regular file", "name too long", "a directory", "a read-only place"])
def test_a_bad_output_is_refused_before_measuring(tmp_path, make_path, fragment, in_process):
    (tmp_path / "file.txt").write_text("not a directory")
    started = time.monotonic()
    done = in_process("run", *SLOW, "--output", make_path(tmp_path), cwd=tmp_path)
    one_line_error(done, fragment)
    assert time.monotonic() - started < 60  # the slow grid would take minutes: nothing was measured
    assert (tmp_path / "file.txt").read_text() == "not a directory"
    no_temporaries(tmp_path)


def test_an_existing_output_without_force_is_refused_before_measuring(tmp_path):
    output = tmp_path / "rec.json"
    output.write_text("precious")
    started = time.monotonic()
    one_line_error(kvbench("run", *SLOW, "--output", output, cwd=tmp_path), "already exists", "--force")
    assert time.monotonic() - started < 60 and output.read_text() == "precious"


@pytest.mark.parametrize("kind", ["fifo", "devnull", "symlink"])
def test_force_never_replaces_what_is_not_a_regular_file(tmp_path, kind, in_process):
    if kind == "fifo":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "real.json").write_text("kept")
        target = tmp_path / "link.json"
        target.symlink_to(tmp_path / "real.json")
    else:
        target = Path(os.devnull)
    done = in_process("run", *TINY, "--output", target, "--force", cwd=tmp_path)
    one_line_error(done, "already exists and is a", "kvbench replaces only regular files")
    mode = os.lstat(target).st_mode
    assert {"fifo": stat.S_ISFIFO, "devnull": stat.S_ISCHR, "symlink": stat.S_ISLNK}[kind](mode)
    if kind == "symlink":
        assert (tmp_path / "real.json").read_text() == "kept"
    no_temporaries(tmp_path)


def test_report_refuses_to_overwrite_the_record_it_reads(tmp_path):
    record = tmp_path / "rec.json"
    assert kvbench("run", *TINY, "--output", record, cwd=tmp_path).returncode == 0
    before = record.read_bytes()
    one_line_error(kvbench("report", record, "--output", record, "--force", cwd=tmp_path), "is the record being read")
    one_line_error(kvbench("report", record, "--plot", tmp_path / "x.pdf", cwd=tmp_path), "must end in .png or .svg")
    assert record.read_bytes() == before


def test_a_failed_final_write_saves_the_record_elsewhere_and_says_where(tmp_path, monkeypatch, capsys):
    """The output passed every check, then the disk filled up: the record goes to results/records/."""
    import errno

    from kvbench import record as record_module
    from kvbench.cli import main

    real, calls = record_module.write_record, []

    def write_record(result, path, force=False):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(result, path, force)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(record_module, "write_record", write_record)
    assert main(["run", *TINY, "--output", str(tmp_path / "rec.json")]) == 2
    line = capsys.readouterr().err.strip()
    saved = Path(line.rsplit(" ", 2)[-2])
    assert line.startswith(f"kvbench: error: cannot write {tmp_path / 'rec.json'}: No space left on device; "
                           "the record was saved to results/records/run-") and line.endswith(" instead")
    assert load_record(tmp_path / saved)["status"] == "complete" and not (tmp_path / "rec.json").exists()


# --- 2. signals never cost completed work -------------------------------------------------------------


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_timing_keeps_the_completed_repetitions(tmp_path, signum, status):
    output = tmp_path / "rec.json"
    done = with_signal_in("kvbench.measure.sampling:time_observed", "run", *TINY, "--output", output, cwd=tmp_path,
                          signals=(signum,), after=5)
    assert done.returncode == status, done.stderr
    record = load_record(output)
    assert record["status"] == "incomplete" and 1 <= len(record["repetitions"]) <= 5
    assert f"interrupted by {signal.Signals(signum).name}: the record keeps {len(record['repetitions'])} " \
           f"repetitions and 4 of 4 checks, marked incomplete: {output}" in done.stderr
    assert "Traceback" not in done.stderr
    no_temporaries(tmp_path)


def test_a_storm_of_signals_after_the_first_does_not_lose_the_record(tmp_path):
    """Ctrl-C, then Ctrl-C again and a `timeout` SIGTERM while the record is being saved."""
    output = tmp_path / "rec.json"
    done = with_signal_in("kvbench.measure.sampling:time_observed", "run", *TINY, "--output", output, cwd=tmp_path,
                          signals=(signal.SIGINT,), after=3, storm=2.0)
    assert done.returncode == 130, done.stderr
    assert load_record(output)["status"] == "incomplete"
    assert "Traceback" not in done.stderr and f"marked incomplete: {output}" in done.stderr
    no_temporaries(tmp_path)


def test_a_signal_during_the_gate_keeps_the_lengths_already_checked(tmp_path):
    output = tmp_path / "rec.json"
    done = with_signal_in("kvbench.workloads.decode:check_equivalence", "run", *TINY, "--output", output, cwd=tmp_path,
                          after=3)  # the first mode of the second length
    assert done.returncode == 143, done.stderr
    record = load_record(output)
    assert [(c["mode"], c["length"]) for c in record["checks"]] == [("full", 4), ("concat", 4)]
    assert record["repetitions"] == [] and record["status"] == "incomplete"


def test_a_signal_during_the_per_step_profile_keeps_every_repetition(tmp_path):
    output = tmp_path / "rec.json"
    done = with_signal_in("kvbench.workloads.benchmark:per_step_seconds", "run", *TINY, "--per-step", "4",
                          "--output", output, cwd=tmp_path)
    assert done.returncode == 143, done.stderr
    record = load_record(output)
    assert len(record["repetitions"]) == 12 and record["status"] == "incomplete" and "per_step" not in record


SIGNAL_ON_IMPORT = """
import importlib.abc, os, sys
class SignalOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:  # imported inside kvbench's start-up: the signal lands mid-import
            os.kill(os.getpid(), {signum})
        return None
sys.meta_path.insert(0, SignalOnImport())
sys.argv = ["kvbench", *{argv!r}]
from kvbench.__main__ import main
raise SystemExit(main())
"""


@pytest.mark.parametrize("command, signum", [
    (["env"], signal.SIGINT), (["show", "missing.json"], signal.SIGTERM), (["run", *TINY], signal.SIGINT),
])
def test_a_signal_while_kvbench_is_still_importing_ends_in_one_line(tmp_path, command, signum):
    """A half-done import of numpy cannot be recovered from: the signal waits for the imports, then ends the
    command. The child sends itself the signal when the command line's options module starts importing,
    so the signal lands mid-import however fast the machine is."""
    script = SIGNAL_ON_IMPORT.format(module="kvbench.cli.options", signum=int(signum), argv=command)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 128 + signum, done.stderr
    assert done.stderr == f"kvbench: interrupted by {signal.Signals(signum).name} while starting; nothing was written\n"
    assert os.listdir(tmp_path) == []


def test_a_signal_during_the_environment_capture_says_nothing_was_written(tmp_path):
    output = tmp_path / "rec.json"
    done = with_signal_in("kvbench.measure.capture:collect_environment", "run", *TINY, "--output", output, cwd=tmp_path)
    assert done.returncode == 143
    assert done.stderr.strip() == "kvbench: interrupted by SIGTERM; nothing was written"
    assert not output.exists()
    no_temporaries(tmp_path)


def test_a_signal_during_the_final_write_finishes_the_write_first(tmp_path):
    output = tmp_path / "rec.json"
    done = with_signal_in("os:fsync", "run", *TINY, "--output", output, cwd=tmp_path,
                          signals=(signal.SIGTERM, signal.SIGINT))
    assert done.returncode == 143, done.stderr
    assert load_record(output)["status"] == "complete"  # everything had been measured
    assert f"SIGTERM arrived while the record was saved; it is complete: {output}" in done.stderr
    no_temporaries(tmp_path)


def test_a_signal_while_report_writes_leaves_no_half_file_and_says_what_was_written(tmp_path):
    record = tmp_path / "rec.json"
    assert kvbench("run", *TINY, "--output", record, cwd=tmp_path).returncode == 0
    plot, report = tmp_path / "plot.svg", tmp_path / "report.html"
    done = with_signal_in("os:fsync", "report", record, "--format", "html", "--plot", plot, "--output", report,
                          cwd=tmp_path, after=2)  # the plot is written, then the report's fsync is hit
    assert done.returncode == 143
    assert done.stderr.strip() == f"kvbench: interrupted by SIGTERM; wrote {plot} before it"
    assert plot.exists() and not report.exists()
    no_temporaries(tmp_path)


def sampling_started(process: subprocess.Popen, timeout: float = 600) -> None:
    """Wait until the child's sampler holds its telemetry open (it opens /proc/thread-self/schedstat once,
    after the gate and before the first timed loop): what the program shows, not a guess at its speed."""
    deadline = time.monotonic() + timeout
    descriptors = Path(f"/proc/{process.pid}/fd")
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if any("schedstat" in os.readlink(fd) for fd in descriptors.iterdir()):
                return
        except OSError:  # a descriptor closed while it was read
            pass
        time.sleep(0.05)
    raise AssertionError(f"the run never started sampling (exit status {process.poll()})")


def test_sigterm_from_outside_during_a_real_run(tmp_path):
    """No hook at all: the signal comes from another process, as `timeout` or a CI runner sends it."""
    output = tmp_path / "rec.json"
    process = subprocess.Popen(kvbench_command("run", *SLOW, "--output", output),
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})
    sampling_started(process)  # the gate is done, the rotations have begun
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    record = load_record(output)
    assert record["status"] == "incomplete" and f"marked incomplete: {output}" in err
    no_temporaries(tmp_path)


REQUEST = ["--preset", "llama-tiny", "--prompt", "6", "--generate", "4", "--modes", "full,static", "--no-progress"]
CONTEXTS = ["--preset", "llama-tiny", "--contexts", "5,9", "--modes", "full,static", "--no-progress"]
WORKLOADS = {"request": REQUEST, "contexts": CONTEXTS}


def assert_kept_and_marked_interrupted(output: Path, kind: str, stderr: str, signum: int) -> dict:
    """The record of an interrupted request or contexts run, as a loop run's: every check, every finished
    sample with what its workload measures, marked incomplete and its sampling stopped as interrupted."""
    record = load_record(output)
    assert record["status"] == "incomplete" and record["run"]["workload"]["kind"] == kind
    assert all(entry["stop"] == "interrupted" for entry in record["sampling"]["lengths"])
    lengths = [9] if kind == "request" else [5, 9]  # a request of 6 + 4 - 1 positions; the contexts asked
    assert sorted((c["mode"], c["length"]) for c in record["checks"]) == \
        sorted((mode, length) for mode in ("full", "static") for length in lengths)
    assert all(c["passed"] for c in record["checks"])
    for rep in record["repetitions"]:
        assert rep["seconds"] > 0 and rep["length"] in lengths
        if kind == "request":  # the prefill, then 3 steps, each timed
            assert rep["ttft_seconds"] > 0 and len(rep["step_seconds"]) == 3
            assert rep["ttft_seconds"] + sum(rep["step_seconds"]) <= rep["seconds"]  # the parts, timed inside it
    assert f"kvbench: interrupted by {signal.Signals(signum).name}: the record keeps {len(record['repetitions'])} " \
           f"repetitions and {len(record['checks'])} of {len(record['checks'])} checks, marked incomplete: {output}" \
           in stderr
    assert "Traceback" not in stderr
    no_temporaries(output.parent)
    return record


@pytest.mark.parametrize("kind, signum", [("request", signal.SIGINT), ("contexts", signal.SIGTERM)])
def test_a_signal_from_outside_during_a_request_or_contexts_run_keeps_what_was_measured(tmp_path, kind, signum):
    output = tmp_path / "rec.json"
    process = subprocess.Popen(kvbench_command("run", *WORKLOADS[kind], "--repeats", "100000", "--output", output),
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    sampling_started(process)  # the gate is done, the rotations have begun; 100000 of them would take hours
    process.send_signal(signum)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, err
    assert_kept_and_marked_interrupted(output, kind, err, signum)


@pytest.mark.parametrize("kind, signum", [("request", signal.SIGTERM), ("contexts", signal.SIGINT)])
def test_a_signal_at_the_fifth_sample_of_a_request_or_contexts_run_keeps_the_samples_before_it(tmp_path, kind,
                                                                                               signum):
    output = tmp_path / "rec.json"
    done = with_signal_in("kvbench.measure.sampling:time_observed", "run", *WORKLOADS[kind], "--repeats", "50",
                          "--warmup", "0", "--output", output, cwd=tmp_path, signals=(signum,), after=5)
    assert done.returncode == 128 + signum, done.stderr
    record = assert_kept_and_marked_interrupted(output, kind, done.stderr, signum)
    assert 4 <= len(record["repetitions"]) <= 5  # the four before the signal, and the fifth if it finished


# --- 3. resource limits end in one line, never in the allocator or a segfault --------------------------


@pytest.mark.parametrize("args, fragment", [
    (["--batch", "100000000"], "the run would need about"),
    (["--vocab-size", "1000000000000"], "weights"),
    (["--width", "1000000000", "--heads", "4"], "of memory is available"),
    (["--max-length", "100000000000"], "the run would need about"),
    (["--threads", "100000"], "--threads: expected an integer in [1, "),
])
def test_a_run_that_cannot_fit_is_refused_with_the_estimate(tmp_path, args, fragment, in_process):
    done = in_process("run", "--lengths", "4", "--no-progress", *args, "--output", tmp_path / "r.json", cwd=tmp_path)
    one_line_error(done, fragment)
    assert not (tmp_path / "r.json").exists()


def test_the_estimate_respects_the_processs_own_memory_limit(tmp_path):
    """5 GiB of weights fit in this machine's memory but not under `ulimit -v` 4 GiB."""
    def four_gib():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    done = subprocess.run([sys.executable, "-m", "kvbench", "run", "--layers", "100000", "--lengths", "4",
                           "--no-progress", "--output", str(tmp_path / "r.json")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=four_gib)
    one_line_error(done, "weights 4.7 GiB", "of memory is available")
    assert not (tmp_path / "r.json").exists()


def test_records_are_read_only_from_regular_files_of_bounded_size_and_depth(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    one_line_error(kvbench("show", fifo, cwd=tmp_path, timeout=60), "is a FIFO, not a regular file")
    one_line_error(kvbench("report", "/dev/zero", cwd=tmp_path, timeout=60), "is a character device")
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(200 << 20)  # sparse: 200 MiB of zeros without the disk space
    one_line_error(kvbench("show", huge, cwd=tmp_path, timeout=60), "larger than the")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    one_line_error(kvbench("compare", deep, deep, cwd=tmp_path, timeout=60), "nested more than 32 levels deep")
    shallow_but_deep = tmp_path / "deep2.json"
    shallow_but_deep.write_text('{"schema": "kvbench.record/1", "x": ' + "[" * 50 + "]" * 50 + "}")
    one_line_error(kvbench("show", shallow_but_deep, cwd=tmp_path), "nested more than 32 levels deep")


@pytest.mark.parametrize("memory", ["1e400", "1e30", "-5GiB", "nan", "inf"])
def test_budget_sizes_must_be_finite_and_in_range(tmp_path, memory, in_process):
    done = in_process("budget", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--tokens", "16",
                   "--memory", memory, cwd=tmp_path, timeout=60)
    one_line_error(done, "--memory")


# --- 4. records are checked for meaning, and every renderer escapes -----------------------------------


@pytest.fixture(scope="module")
def sound_record(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("sound")
    run = [*TINY, "--modes", "full,concat,quantized-int8"]  # a lossy kind too: its check is a drift check
    from machine_stubs import canned_environment, cheap_probe_calls

    from kvbench.cli import main
    from kvbench.measure import capture, machine

    with pytest.MonkeyPatch.context() as patch:  # a real run, in this process, with the tests' probe and capture
        patch.setattr(machine, "probe_calls", cheap_probe_calls)
        patch.setattr(capture, "collect_environment", canned_environment)
        assert main([str(a) for a in ["run", *run, "--output", directory / "rec.json"]]) == 0
    return json.loads((directory / "rec.json").read_text())


def tampered(record: dict, change) -> dict:
    copy = json.loads(json.dumps(record))
    change(copy)
    return copy


def concat_check(record, length=4, mode="concat"):
    return next(c for c in record["checks"] if c["mode"] == mode and c["length"] == length)


def drift_check(record, length=4):
    return concat_check(record, length, mode="quantized-int8")


TAMPERING = {
    "NaN in a check": (lambda r: concat_check(r).update(max_abs_diff=float("nan")),
                       "/max_abs_diff: non-finite number NaN"),
    "infinity in memory": (lambda r: r["memory"][0].update(peak_rss_growth_bytes=float("inf")),
                           "memory/0/peak_rss_growth_bytes: non-finite number Infinity"),
    "passed beyond its tolerance": (lambda r: concat_check(r).update(max_abs_diff=0.5), "exceeds its tolerance"),
    "passed using 5e4 times its tolerance": (lambda r: concat_check(r).update(tolerance_used=5e4),
                                             "uses 5e+04 times its tolerance"),
    "a check in another dtype": (lambda r: concat_check(r).update(dtype="float16"), "the config's dtype is float32"),
    "a protocol contradicting the run": (lambda r: r["protocol"].update(repeats=9), "protocol/repeats is 9"),
    "a sample of 1e300 seconds": (lambda r: r["repetitions"][0].update(seconds=1e300),
                                  "1e+300 is greater than the maximum of 1000000.0"),
    "a timed cell without memory": (lambda r: r["memory"].remove(next(m for m in r["memory"] if m["mode"] == "concat")),
                                    "was timed, but memory has no entry"),
    "passed with a divergence": (lambda r: concat_check(r).update(first_divergent_position=2), "but it diverges"),
    "bytes contradicting the formula": (lambda r: r["memory"][1].update(measured_bytes=12345), "contradicts the formula"),
    "a wrong formula": (lambda r: r["memory"][1].update(expected_bytes=1), "the formula gives"),
    "width of the wrong type": (lambda r: r["config"].update(width="wide"), "config/width: 'wide' is not of type 'integer'"),
    "an unknown config field": (lambda r: r["config"].update(colour="red"), "Additional properties"),
    "heads not dividing width": (lambda r: r["config"].update(heads=5), "heads must divide width"),
    "a summary cell for a mode that never ran": (
        lambda r: r["summary"]["cells"].append({**r["summary"]["cells"][0], "mode": "static"}),
        "summary has a cell for mode 'static'"),
    "an unknown mode": (lambda r: r["run"]["modes"].append("turbo"), "unknown mode 'turbo'"),
    "terminal markup in a mode": (lambda r: r["run"]["modes"].append("[bold red]x[/]"), "does not match"),
    "HTML in a mode": (lambda r: r["run"]["modes"].append("<script>alert(1)</script>"), "does not match"),
    "drift passed beyond its limits": (lambda r: drift_check(r).update(kl_max=0.5), "says otherwise"),
    "two disagreements called passed": (lambda r: drift_check(r).update(top1_agreement=0.5, top1_disagreements=2),
                                        "says otherwise"),
    "disagreements without a lower agreement": (lambda r: drift_check(r).update(top1_disagreements=3),
                                                "every step agrees exactly when none disagrees"),
    "a drift limit nobody knows": (lambda r: drift_check(r)["limits"].update(vibes=1), "names its limits among"),
    "a length beyond max_length": (lambda r: r["run"]["lengths"].append(5000), "exceeds the config's max_length"),
}


@pytest.mark.parametrize("case", list(TAMPERING))
def test_a_record_that_means_something_impossible_is_rejected(tmp_path, sound_record, case, capsys, in_process):
    from kvbench.cli import main

    change, fragment = TAMPERING[case]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(tampered(sound_record, change), allow_nan=True))
    one_line_error(in_process("show", path, cwd=tmp_path, timeout=60), str(path), fragment)
    for command in (["report", path, "--format", "markdown"], ["compare", path, path]):  # the same reader
        assert main([str(a) for a in command]) == 2
        assert fragment in capsys.readouterr().err


def test_every_renderer_escapes_what_a_record_carries():
    """Defence in depth: the schema refuses such names, and the layouts would not interpret them anyway."""
    from kvbench.report.record import html, markdown, model, terminal
    from kvbench.report.format import render_plain
    from kvbench.measure.stats import RatioEstimate

    nasty = "[bold red]x[/]<script>*_y_*\x1b[2J\x07"  # markup, HTML, markdown, a terminal clear and a bell
    row = model.Row(length=4, mode=nasty, samples=3, planned=3, median=1.0, q1=0.9, q3=1.1, is_baseline=False,
                    speedup=RatioEstimate(2.0, 1.9, 2.1, 3), speedup_valid=True, check=None, memory=None, marks=())
    report = model.Report(title=f"kvbench {nasty}", source="<b>src</b>", status="complete", created_utc="now",
                          command=["kvbench", nasty], baseline="full", environment={}, rows=[row],
                          fits={nasty: None}, profile=None, missing=[])
    text = render_plain(terminal.report_renderables(report))
    assert "[bold red]x[/]" in text  # printed literally, not interpreted as markup
    page = html.render_report(report, images={})
    assert "<script>" not in page and "&lt;script&gt;" in page
    md = markdown.render_report(report)
    assert "<script>" not in md and "\\*\\_y\\_\\*" in md
    for output in (text, page, md):
        assert "\x1b" not in output and "\x07" not in output  # shown as escapes, never sent
    assert "\\x1b[2J" in text


# --- 6. numbers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (["run", "--lengths", "8_0"], "--lengths: expected comma-separated positive integers, got '8_0'"),
    (["run", "--lengths", "٨"], "--lengths: expected comma-separated positive integers, got '٨'"),
    (["run", "--repeats", "٣"], "--repeats: expected an integer in [1, 100000], got '٣'"),
    (["run", "--seed", str(2**70)], "--seed: expected an integer in [0, 9223372036854775807], got 1180591620717411303424"),
    (["run", "--repeats", "10000000"], "--repeats: expected an integer in [1, 100000], got 10000000"),
    (["run", "--batch", "+3"], "--batch: expected an integer >= 1, got '+3'"),
    (["compare", "a.json", "b.json", "--factor", "inf"], "--factor: expected a finite number, got 'inf'"),
    (["compare", "a.json", "b.json", "--factor", "nan"], "--factor: expected a finite number, got 'nan'"),
    (["compare", "a.json", "b.json", "--alpha", "nan"], "--alpha: expected a finite number, got 'nan'"),
    (["compare", "a.json", "b.json", "--factor", "1"], "--factor must be greater than 1, got 1"),
    (["compare", "a.json", "b.json", "--factor", "1_1"], "--factor: expected a number, got '1_1'"),
    (["compare", "a.json", "b.json", "--alpha", "٠.٠٥"], "--alpha: expected a number, got '٠.٠٥'"),
    (["budget", "--layers", "1", "--kv-heads", "1", "--head-dim", "8", "--tokens", "8", "--memory", "1GiB",
      "--block-size", "0"], "--block-size: expected an integer >= 1, got 0"),
])
def test_numbers_are_plain_finite_and_in_range(tmp_path, args, fragment, in_process):
    one_line_error(in_process(*args, cwd=tmp_path, timeout=60), fragment)


# --- an evicting kind's options, refused before anything runs (issue 35) ------------------------------------------


@pytest.mark.parametrize("args, fragment", [
    (["--modes", "knorm", "--evict-ratio", "1"], "argument --evict-ratio: expected a fraction in [0, 1) such as 0.5, "
                                                 "got '1'"),
    (["--modes", "knorm", "--evict-ratio", "-0.5"], "argument --evict-ratio: expected a fraction in [0, 1)"),
    (["--modes", "knorm", "--evict-every", "0"], "argument --evict-every: expected an integer >= 1, got 0"),
    (["--modes", "knorm", "--evict-ratio", "0.5", "--kv-keep", "4"], "not allowed with argument --evict-ratio"),
    (["--modes", "tova", "--prompt", "16", "--generate", "4", "--kv-keep", "17"],
     "--kv-keep 17 is above the 16 tokens of the shortest prompt this run compresses: expected at most 16"),
    (["--modes", "streamingllm", "--kv-keep", "3"], "--modes streamingllm: streamingllm: kv_keep is the positions each "
                                                    "head keeps, an integer of at least 4 (what streamingllm always keeps), got 3"),
    (["--modes", "snapkv", "--contexts", "128", "--kv-keep", "32"], "an integer of at least 64 (what snapkv always keeps)"),
    (["--modes", "h2o", "--window", "8"], "--modes h2o: h2o evicts by its own rule and needs full attention"),
    (["--modes", "static", "--evict-ratio", "0.5"], "--evict-ratio is read by the evicting kinds only, and --modes "
                                                    "static runs none of them"),
], ids=["ratio 1", "negative ratio", "every 0", "ratio and keep", "keep above the prompt", "keep below the sinks",
        "keep below the window", "a window", "no evicting kind"])
def test_an_evicting_kinds_bad_options_are_refused_before_anything_runs(tmp_path, args, fragment, in_process):
    started = time.monotonic()
    done = in_process("run", "--repeats", "200", "--no-progress", *args, "--output", tmp_path / "r.json", cwd=tmp_path)
    one_line_error(done, fragment)
    assert time.monotonic() - started < 60 and not (tmp_path / "r.json").exists()
