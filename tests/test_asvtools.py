"""Contract tests for kvbench.asvtools: names asv uses, how a run is identified, captures,
machine registration and `kvbench asv-show`, failure branches included. No asv run here
(tests/test_asv.py runs the real asv)."""

import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
from asv import environment as asv_environment
from asv import results as asv_results
from asv.config import Config
from asv.machine import MachineCollection
from asv.runner import BenchmarkResult

from kvbench import asvtools, cli
from kvbench.measure import capture

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"]
HOSTNAME = platform.uname().node


@pytest.fixture(scope="module")
def environment():
    return capture.collect_environment()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty HOME, so ~/.asv-machine.json is the test's own."""
    path = tmp_path / "home"
    path.mkdir()
    monkeypatch.setenv("HOME", str(path))
    return path


class FakeAsvProcess:
    def __init__(self, cwd, pid=4242, started=1234.5):
        self._cwd, self.pid, self._started = str(cwd), pid, started

    def cwd(self):
        return self._cwd

    def create_time(self):
        return self._started


@pytest.fixture
def project(tmp_path):
    """A git repository with an asv.conf.json and one commit."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "asv.conf.json").write_text(json.dumps({"version": 1, "repo": ".", "results_dir": "results/asv"}))
    subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", "one"], check=True)
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    return root, head


def as_asv_child(monkeypatch, process, argv):
    monkeypatch.setattr(asvtools, "find_asv_process", lambda: (process, argv))


# --- names: the same as asv's own ----------------------------------------------


@pytest.mark.parametrize("env_name", ["existing-py_usr_bin_python", "virtualenv-py3.11-torch2.13.0" + "-X1" * 60])
def test_result_file_name_is_asvs(env_name):
    commit = "0123456789abcdef" * 2 + "01234567"
    assert os.path.join("m1", asvtools.result_file_name(commit, env_name)) == \
        asv_results.get_filename("m1", commit, env_name)


MATRIX = {"req": {"torch": "2.13.0"}, "env": {"A_BUILD": "x"}, "env_nobuild": {"OMP_NUM_THREADS": "1"}}


@pytest.mark.parametrize(("argv", "applies_matrix"), [
    (["run", "-E", f"existing:{sys.executable}"], False),
    (["run", "-E", "existing"], False),
    (["run", "--python=same"], True),  # asv applies the matrix here (its --python quirk)
    (["run", "--python", "same"], True),
    (["run", "-E", ":same"], True),
])
def test_existing_env_name_is_asvs(argv, applies_matrix):
    conf_json = {"repo": ".", "environment_type": "virtualenv", "matrix": MATRIX}
    conf = Config.from_json(dict(conf_json))
    specs = asvtools.parse_asv_command(argv)["env_specs"]
    (env,) = asv_environment.get_environments(conf, specs, verbose=False)
    environ = {**os.environ, **env.env_vars}  # what asv gives the benchmark process
    env_vars = asvtools.matrix_env_vars(specs, conf_json, environ)
    assert bool(env_vars) == applies_matrix
    assert asvtools.existing_env_name(sys.executable, env_vars) == env.name


def test_capture_path_mirrors_the_result_path(tmp_path):
    result = tmp_path / "results" / "asv" / "m1" / "0123abcd-env.json"
    assert asvtools.capture_path_for_result(result) == tmp_path / "results" / "captures" / "m1" / "0123abcd-env.json"
    assert asvtools.captures_dir(asvtools.RESULTS_DIR) == asvtools.RESULTS_DIR.parent / "captures"


# --- which asv run ----------------------------------------------------------------


@pytest.mark.parametrize(("cmdline", "expected"), [
    (["/v/bin/python3", "/v/bin/asv", "run", "--quick"], ["run", "--quick"]),
    (["python", "-m", "asv", "continuous", "main", "HEAD"], ["continuous", "main", "HEAD"]),
    (["python", "-masv", "run"], ["run"]),
    (["/v/bin/python", "/v/lib/asv/benchmark.py", "run"], None),
    (["sh", "-c", "asv run"], None),
])
def test_asv_arguments(cmdline, expected):
    assert asvtools.asv_arguments(cmdline) == expected


@pytest.mark.parametrize(("args", "expected"), [
    (["run", "--quick", "-b", "Time", "--machine", "m1"],
     {"command": "run", "machine": "m1", "set_commit_hash": None, "dry_run": False, "config": None,
      "env_specs": []}),
    (["--config", "sub/asv.conf.json", "run", "-m", "m2", "--set-commit-hash", "HEAD", "-E", "existing:python"],
     {"command": "run", "machine": "m2", "set_commit_hash": "HEAD", "dry_run": False, "config": "sub/asv.conf.json",
      "env_specs": ["existing:python"]}),
    (["run", "--machine=m3", "-n", "--python=same"],
     {"command": "run", "machine": "m3", "set_commit_hash": None, "dry_run": True, "config": None,
      "env_specs": [":same"]}),
    (["continuous", "main", "HEAD"], {"command": "continuous", "machine": None, "set_commit_hash": None,
                                      "dry_run": False, "config": None, "env_specs": []}),
])
def test_parse_asv_command(args, expected):
    assert asvtools.parse_asv_command(args) == expected


def test_resolve_machine_like_asv(home):
    assert asvtools.resolve_machine(None) == HOSTNAME  # nothing registered: asv's default
    assert asvtools.resolve_machine("m1") == "m1"
    MachineCollection.save("only", {"machine": "only"})
    assert asvtools.resolve_machine(None) == "only"  # asv uses the single entry for the hostname
    assert asvtools.resolve_machine("other") == "other"
    MachineCollection.save(HOSTNAME, {"machine": HOSTNAME})
    assert asvtools.resolve_machine(None) == HOSTNAME


def test_run_in_an_environment_asv_built(tmp_path, monkeypatch, home):
    as_asv_child(monkeypatch, FakeAsvProcess(tmp_path), ["run", "--machine", "m1", "main~2..main"])
    (tmp_path / "asv.conf.json").write_text(json.dumps({"repo": ".", "results_dir": "results/asv"}))
    environ = {"ASV_COMMIT": "c" * 40, "ASV_ENV_NAME": "virtualenv-py3.11", "ASV_CONF_DIR": str(tmp_path)}
    run = asvtools.current_asv_run(environ)
    assert (run.machine, run.commit_hash, run.env_name) == ("m1", "c" * 40, "virtualenv-py3.11")
    assert run.capture_path == tmp_path / "results" / "captures" / "m1" / "cccccccc-virtualenv-py3.11.json"
    assert run.result_path == tmp_path / "results" / "asv" / "m1" / "cccccccc-virtualenv-py3.11.json"
    assert run.invocation == "4242@1234.50"
    assert run.sources["commit_hash"] == "ASV_COMMIT"


def test_run_in_an_existing_environment(project, monkeypatch, home):
    root, head = project
    as_asv_child(monkeypatch, FakeAsvProcess(root), ["run", "-E", "existing:python", "--set-commit-hash", "HEAD"])
    run = asvtools.current_asv_run({})
    assert run.commit_hash == head
    assert run.env_name == asvtools.existing_env_name(sys.executable)
    assert run.machine == HOSTNAME
    assert run.results_dir == root / "results" / "asv"


def test_run_with_a_config_elsewhere(project, monkeypatch, home):
    root, head = project
    (root / "asv.conf.json").rename(root / "custom.json")
    as_asv_child(monkeypatch, FakeAsvProcess(root), ["--config", "x/custom.json", "run", "--set-commit-hash", head])
    assert asvtools.current_asv_run({}).commit_hash == head


@pytest.mark.parametrize(("argv", "environ", "reason"), [
    (["run", "-E", "existing:python"], {}, "without --set-commit-hash"),
    (["run", "--dry-run"], {"ASV_COMMIT": "c" * 40, "ASV_ENV_NAME": "e"}, "--dry-run"),
    (["dev"], {}, "saves no results"),
    (["profile", "x"], {}, "saves no results"),
    (["run", "--set-commit-hash", "no-such-ref"], {}, "cannot resolve"),
])
def test_runs_that_save_no_result_get_no_capture(project, monkeypatch, home, argv, environ, reason):
    root, _ = project
    as_asv_child(monkeypatch, FakeAsvProcess(root), argv)
    with pytest.raises(asvtools.NoAsvRun, match=reason):
        asvtools.current_asv_run(environ)


def test_no_asv_process_needs_asv_conf_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(asvtools, "find_asv_process", lambda: (None, None))
    with pytest.raises(asvtools.NoAsvRun, match="no ASV_CONF_DIR"):
        asvtools.current_asv_run({"ASV_COMMIT": "c" * 40, "ASV_ENV_NAME": "e"})
    (tmp_path / "asv.conf.json").write_text(json.dumps({"repo": "."}))
    run = asvtools.current_asv_run({"ASV_COMMIT": "c" * 40, "ASV_ENV_NAME": "e", "ASV_CONF_DIR": str(tmp_path)})
    assert run.invocation is None and run.results_dir == tmp_path / "results"


def test_find_asv_process_outside_asv():
    assert asvtools.find_asv_process() == (None, None)  # pytest's parents do not run asv


# --- the capture ------------------------------------------------------------------


def a_run(tmp_path, invocation="1@1.00"):
    return asvtools.AsvRun(machine="m1", commit_hash="a" * 40, env_name="virtualenv-py3.11", conf_dir=tmp_path,
                           results_dir=tmp_path / "results" / "asv", invocation=invocation,
                           command=["asv", "run"], sources={"machine": "test"})


def test_write_and_load_capture(tmp_path, environment):
    path = asvtools.write_capture(a_run(tmp_path), environment)
    assert path == tmp_path / "results" / "captures" / "m1" / "aaaaaaaa-virtualenv-py3.11.json"
    document = asvtools.load_capture(path)
    assert document["schema"] == asvtools.CAPTURE_SCHEMA
    assert document["result_file"] == "m1/aaaaaaaa-virtualenv-py3.11.json"
    assert document["environment"] == environment
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left behind


def test_capture_once_per_asv_invocation(tmp_path, monkeypatch, environment):
    runs = iter([a_run(tmp_path, "1@1.00"), a_run(tmp_path, "1@1.00"), a_run(tmp_path, "2@2.00")])
    monkeypatch.setattr(asvtools, "current_asv_run", lambda: next(runs))
    collected = []
    monkeypatch.setattr(capture, "collect_environment", lambda: collected.append(1) or environment)
    first = asvtools.capture_beside_results()
    assert first is not None and len(collected) == 1
    assert asvtools.capture_beside_results() is None  # a later round of the same `asv run`
    assert len(collected) == 1
    assert asvtools.capture_beside_results() == first  # a new `asv run` replaces it
    assert json.loads(first.read_text())["asv"]["invocation"] == "2@2.00"


def test_a_benchmark_annotates_the_capture_beside_its_result(tmp_path, monkeypatch, environment):
    run = a_run(tmp_path)
    monkeypatch.setattr(asvtools, "current_asv_run", lambda: run)
    assert asvtools.annotate_capture("track_speedup", "static@64", {"speedup": 2.0}) is None  # no capture yet
    path = asvtools.write_capture(run, environment)
    assert asvtools.annotate_capture("track_speedup", "static@64", {"speedup": 2.0, "half_width": 0.01}) == path
    asvtools.annotate_capture("track_speedup", "paged@64", {"speedup": 2.1})
    document = asvtools.load_capture(path)
    assert document["track_speedup"] == {"static@64": {"speedup": 2.0, "half_width": 0.01},
                                         "paged@64": {"speedup": 2.1}}
    assert document["environment"] == environment


def test_capture_never_raises(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(asvtools, "current_asv_run", lambda: (_ for _ in ()).throw(asvtools.NoAsvRun("dry run")))
    assert asvtools.capture_beside_results() is None
    assert "no capture written: dry run" in capsys.readouterr().err

    monkeypatch.setattr(asvtools, "current_asv_run", lambda: a_run(tmp_path))
    monkeypatch.setattr(capture, "collect_environment", lambda: 1 / 0)
    assert asvtools.capture_beside_results() is None
    assert "capture failed: ZeroDivisionError" in capsys.readouterr().err
    assert not (tmp_path / "results" / "captures" / "m1").exists() or \
        not list((tmp_path / "results" / "captures" / "m1").iterdir())


@pytest.mark.parametrize(("content", "message"), [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ("[]", "not a kvbench asv capture"),
    (json.dumps({"schema": "other/1"}), "not a kvbench asv capture"),
    (json.dumps({"schema": asvtools.CAPTURE_SCHEMA}), "missing key 'machine'"),
    (json.dumps({"schema": asvtools.CAPTURE_SCHEMA, "machine": "m", "commit_hash": "c", "env_name": "e",
                 "result_file": "m/c-e.json", "environment": {"timestamp_utc": "x"}}), "invalid environment"),
])
def test_load_capture_rejects(tmp_path, content, message):
    path = tmp_path / "capture.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(asvtools.AsvToolError, match=message):
        asvtools.load_capture(path)


# --- kvbench asv-machine ----------------------------------------------------------


def test_machine_info_from_capture(environment):
    info = asvtools.machine_info("m1", environment)
    assert set(info) == {"machine", "os", "arch", "cpu", "num_cpu", "ram"}
    assert all(isinstance(v, str) for v in info.values())
    assert info["machine"] == "m1"
    assert info["arch"] == platform.machine()
    assert info["num_cpu"] == str(os.cpu_count())
    assert info["os"].startswith(platform.system())


def test_machine_info_tolerates_missing_sections():
    info = asvtools.machine_info(None, {"cpu": None, "system": None, "os": None, "unavailable": {}})
    assert info["machine"] == HOSTNAME and info["cpu"] == "" and info["ram"] == ""


def test_asv_machine_command(home, capsys):
    assert cli.main(["asv-machine", "--name", "bench-1"]) == 0
    out = capsys.readouterr().out
    assert "registered asv machine 'bench-1'" in out
    stored = MachineCollection.load("bench-1")  # what `asv run --machine bench-1` reads
    assert stored["machine"] == "bench-1" and stored["cpu"] and stored["ram"]
    assert cli.main(["asv-machine", "--name", "bench-1"]) == 0
    assert "updated asv machine 'bench-1'" in capsys.readouterr().out


@pytest.mark.parametrize("name", [".", "..", "a/b", "../up", "a\\b", "", "with.dot", "-leading", "_leading", "a b",
                                  "<b>x</b>", "x|y", "*bold*", "[x](y)", "a\x1b[2Jb", "new\nline", "café", "x" * 65])
def test_asv_machine_refuses_a_name_that_is_not_a_plain_word(home, capsys, name):
    """The name is a folder under results/asv/ and a label on pages and terminals."""
    assert cli.main(["asv-machine", f"--name={name}"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("kvbench: error: machine name must be a plain word") and err.count("\n") == 1
    assert not (home / ".asv-machine.json").exists()


@pytest.mark.parametrize("name", ["bench-1", "ci_runner", "History-A", "x" * 64, "0"])
def test_asv_machine_accepts_plain_words(home, capsys, name):
    assert cli.main(["asv-machine", "--name", name]) == 0
    assert MachineCollection.load(name)["machine"] == name


def test_asv_machine_asks_for_a_name_when_the_hostname_is_not_a_plain_word(home):
    with pytest.raises(asvtools.AsvToolError, match=r"got 'node\.example\.org'; pass --name NAME"):
        asvtools.register_machine(None, {"os": {"hostname": "node.example.org"}})
    assert not (home / ".asv-machine.json").exists()


# --- kvbench asv-show -------------------------------------------------------------


def write_asv_result(results_dir, machine="m1", commit="b" * 40, env_name="virtualenv-py3.11", samples=True):
    """A result file written by asv's own Results API, and the benchmarks.json beside it."""
    params = {"machine": machine, "cpu": "CPU", "num_cpu": "2", "ram": "1000", "os": "Linux", "arch": "x86_64",
              "python": "3.11"}
    result = asv_results.Results(params, {"torch": "2.13.0"}, commit, 0, "3.11", env_name, {"OMP_NUM_THREADS": "1"})
    time_bench = {"name": "decode.TimeDecode.time_decode", "params": [["'full'", "'static'"], ["64"]],
                  "param_names": ["mode", "length"], "version": "kvbench-decode-1", "type": "time",
                  "unit": "seconds"}
    track_bench = {"name": "speedup.TrackSpeedup.track_speedup", "params": [["'static'"], ["64"]],
                   "param_names": ["mode", "length"], "version": "kvbench-speedup-1", "type": "track", "unit": "x"}
    raw = [[0.020, 0.021, 0.019, 0.022, 0.020], [0.010, 0.011, 0.009, 0.010, 0.012]]
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    result.add_result(time_bench, BenchmarkResult(result=[0.020, None], samples=[raw[0], None], number=[1, None],
                                                  errcode=1, stderr="boom", profile=None),
                      record_samples=samples, started_at=when, duration=1.0)
    result.add_result(track_bench, BenchmarkResult(result=[2.0], samples=[None], number=[None], errcode=0,
                                                   stderr="", profile=None),
                      record_samples=samples, started_at=when, duration=1.0)
    result.save(str(results_dir))
    (results_dir / "benchmarks.json").write_text(json.dumps(
        {"version": 2, time_bench["name"]: time_bench, track_bench["name"]: track_bench}))
    return results_dir / asv_results.get_filename(machine, commit, env_name)


def test_asv_show_prints_samples_and_capture(tmp_path, environment, capsys):
    results_dir = tmp_path / "results" / "asv"
    path = write_asv_result(results_dir)
    run = asvtools.AsvRun(machine="m1", commit_hash="b" * 40, env_name="virtualenv-py3.11", conf_dir=tmp_path,
                          results_dir=results_dir)
    asvtools.write_capture(run, environment)
    assert cli.main(["asv-show", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"commit   {'b' * 40}" in out
    assert "requirements: torch==2.13.0" in out and "env vars: OMP_NUM_THREADS=1" in out
    assert f"capture  {asvtools.capture_path_for_result(path)}" in out
    assert f"torch {environment['torch']['version']}" in out
    assert "decode.TimeDecode.time_decode [seconds] version kvbench-decode-1" in out
    assert "mode='full', length=64: median 20.0ms, 99% CI [" in out
    assert "samples (ms): 20 21 19 22 20" in out  # in the median's unit, not 0.02 0.021 ... seconds
    assert "mode='static', length=64: median failed" in out
    assert "mode='static', length=64: value 2" in out


def test_asv_show_scales_numbers_and_fits_the_terminal(tmp_path, environment, capsys, monkeypatch):
    """Bytes in binary units, a load average to two decimals (not 25276071936 bytes and 7.51171875), and every
    line within $COLUMNS but a path or number too long to break, which runs past it whole."""
    results_dir = tmp_path / "results" / "asv"
    path = write_asv_result(results_dir)
    run = asvtools.AsvRun(machine="m1", commit_hash="b" * 40, env_name="virtualenv-py3.11", conf_dir=tmp_path,
                          results_dir=results_dir)
    environment = {**environment, "system": {**environment["system"], "load_average": [7.51171875, 2.5, 0.125],
                                             "memory_total_bytes": 25276071936}}
    asvtools.write_capture(run, environment)
    monkeypatch.setenv("COLUMNS", "72")
    assert cli.main(["asv-show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ram 1,000 B" in out and "memory 23.5 GiB," in " ".join(out.split())
    assert "load 7.51, 2.50, 0.12," in " ".join(out.split()) and "7.51171875" not in out
    assert "25276071936" not in out
    wide = [line for line in out.splitlines() if len(line) > 72]
    assert all(" " not in line.strip() for line in wide), wide  # only an unbreakable word runs past


def test_asv_show_without_samples_or_capture(tmp_path, capsys):
    path = write_asv_result(tmp_path / "results" / "asv", samples=False)
    assert cli.main(["asv-show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "capture  none:" in out and "no such file" in out
    assert "samples: not recorded (run asv with --record-samples)" in out


def test_asv_show_reads_a_result_with_skipped_parameters(capsys):
    """asv writes NaN for a parameter combination `--bench` skipped; a real result of results/history."""
    result = sorted((Path(__file__).resolve().parents[1] / "results" / "history" / "asv" / "history-a").glob("*-*.json"))[0]
    assert "NaN" in result.read_text()
    assert cli.main(["asv-show", str(result)]) == 0
    out = capsys.readouterr().out
    assert "mode='paged', length=64: median skipped" in out and "mode='full', length=64: median" in out


def test_asv_show_warns_about_a_mismatched_capture(tmp_path, environment, capsys):
    results_dir = tmp_path / "results" / "asv"
    path = write_asv_result(results_dir)
    other = asvtools.write_capture(a_run(tmp_path), environment)
    capture_path = asvtools.capture_path_for_result(path)
    other.rename(capture_path)
    assert cli.main(["asv-show", str(path)]) == 0
    assert "WARNING: this capture is for commit " + "a" * 40 in capsys.readouterr().out


@pytest.mark.parametrize(("name", "content", "message"), [
    ("missing.json", None, "no such file"),
    ("bad.json", "{\"commit_hash\": ", "not valid JSON"),
    ("list.json", "[1, 2]", "not an asv result file"),
    ("machine.json", json.dumps({"machine": "m1", "version": 1}), "asv's machine.json, not a result file"),
    ("benchmarks.json", json.dumps({"version": 2}), "asv's benchmarks.json, not a result file"),
    ("record.json", json.dumps({"schema": "kvbench.record/1"}), "not an asv result file"),
    ("broken.json", json.dumps({"version": 2, "commit_hash": "c", "result_columns": ["result"]}),
     "cannot load asv result"),
])
def test_asv_show_bad_files_exit_2_with_one_line(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    assert cli.main(["asv-show", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kvbench: error: ") and captured.err.count("\n") == 1
    assert message in captured.err


def test_asv_show_directory(tmp_path, capsys):
    assert cli.main(["asv-show", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
