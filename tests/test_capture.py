"""Contract tests for kvbench.measure.capture: every promised key, every failure branch."""

import builtins
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import types

import cpuinfo
import psutil
import pytest
import torch

import kvbench
from kvbench.measure import capture

pytestmark = pytest.mark.real_machine  # the capture itself, never the canned one (tests/conftest.py)

ON_LINUX = sys.platform.startswith("linux")
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid",
       "-c", "commit.gpgsign=false"]


@pytest.fixture(scope="module")
def real_env():
    return capture.collect_environment()


@pytest.fixture
def fresh_cpuinfo(monkeypatch):
    """Empty the cpuinfo cache for one test, then put the real result back.

    get_cpu_info() costs ~1 s; re-priming from the saved result keeps the suite fast.
    """
    saved = capture._cpuinfo()
    capture._cpuinfo.cache_clear()
    yield
    capture._cpuinfo.cache_clear()
    with pytest.MonkeyPatch.context() as mp:  # the test's own patches are still active
        mp.setitem(sys.modules, "cpuinfo", cpuinfo)
        mp.setattr(cpuinfo, "get_cpu_info", lambda: saved)
        capture._cpuinfo()


def _run(*cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def assert_contract(env):
    """Every registered key is present with its type, or None with a recorded reason."""
    assert capture.validate_environment(env) == []
    unavailable = env["unavailable"]
    for path, expected in capture.KEY_TYPES.items():
        section, _, key = path.rpartition(".")
        holder = env[section] if section else env
        if holder is None:
            assert unavailable[section]
            continue
        value = holder[key]
        if value is None and not capture._type_ok(None, expected):
            assert unavailable[path], path
        else:
            assert capture._type_ok(value, expected), (path, value)
    assert json.loads(json.dumps(env)) == env  # no tuples, no custom objects


# -- the real collection ------------------------------------------------------


def test_real_collection_meets_contract(real_env):
    assert_contract(real_env)
    assert list(real_env) == ["timestamp_utc", *capture.SECTIONS, "unavailable"]
    # With torch, psutil and py-cpuinfo installed no whole section may be lost.
    assert [s for s in capture.SECTIONS if real_env[s] is None] == []


def test_real_values(real_env):
    py, tc, cpu, sysm, osx = (real_env[s] for s in ("python", "torch", "cpu", "system", "os"))
    assert py["version"] == platform.python_version()
    assert py["executable"] == sys.executable
    assert tc["version"] == str(torch.__version__)
    assert tc["git_version"] == torch.version.git_version
    assert tc["intra_op_threads"] == torch.get_num_threads() >= 1
    assert tc["inter_op_threads"] == torch.get_num_interop_threads() >= 1
    assert tc["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert tc["default_dtype"] == "float32"
    assert "ATen/Parallel" in tc["parallel_info"]
    assert set(cpu["flags"]) <= set(capture.KERNEL_FLAGS)
    assert cpu["has_avx2"] == ("avx2" in cpu["flags"])
    assert cpu["count"] == os.cpu_count() == sysm["logical_cores"]
    assert sysm["physical_cores"] <= sysm["logical_cores"]
    assert 0 < sysm["memory_available_bytes"] <= sysm["memory_total_bytes"]
    assert len(sysm["load_average"]) == 3
    if hasattr(os, "sched_getaffinity"):
        assert sysm["cpu_affinity"] == sorted(os.sched_getaffinity(0))
    assert osx["hostname"] == socket.gethostname()
    assert osx["machine"] == platform.machine()
    stamp = datetime.datetime.fromisoformat(real_env["timestamp_utc"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == datetime.timedelta(0)
    assert abs(datetime.datetime.now(datetime.timezone.utc) - stamp).total_seconds() < 600


def test_git_info_of_this_checkout(real_env):
    info, unavailable = real_env["kvbench"], real_env["unavailable"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(kvbench.__file__)))
    assert info["version"]
    has_head = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=root,
                              capture_output=True).returncode == 0
    if has_head:
        assert info["git_commit"] == _run("git", "rev-parse", "HEAD", cwd=root)
        assert isinstance(info["git_dirty"], bool)
    else:
        assert info["git_commit"] is None and info["git_dirty"] is None
        assert unavailable["kvbench.git_commit"] == "no commits yet"


def test_repeated_collection_is_fast_and_stable(real_env):
    again = capture.collect_environment()  # cpuinfo is cached
    assert again["cpu"] == real_env["cpu"]
    assert again["python"] == real_env["python"]


# -- whole sources failing -----------------------------------------------------


def test_cpuinfo_raising_gives_none_section(monkeypatch, fresh_cpuinfo):
    def boom():
        raise RuntimeError("cpuid exploded")

    monkeypatch.setattr(cpuinfo, "get_cpu_info", boom)
    env = capture.collect_environment()
    assert env["cpu"] is None
    assert env["unavailable"]["cpu"] == "RuntimeError: cpuid exploded"
    assert not any(k.startswith("cpu.") for k in env["unavailable"])
    assert env["torch"]["cpu_capability"]  # the other sources are untouched
    assert_contract(env)


def _assert_import_failure(module, section, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    env = capture.collect_environment()
    assert env[section] is None
    assert env["unavailable"][section] == (
        f"ModuleNotFoundError: import of {module} halted; None in sys.modules")
    assert_contract(env)


@pytest.mark.parametrize("module, section", [("psutil", "system"), ("torch", "torch")])
def test_missing_module_gives_none_section(monkeypatch, module, section):
    _assert_import_failure(module, section, monkeypatch)


def test_missing_cpuinfo_gives_none_section(monkeypatch, fresh_cpuinfo):
    _assert_import_failure("cpuinfo", "cpu", monkeypatch)


def test_section_failure_discards_its_partial_reasons(monkeypatch):
    def half_then_crash(notes):
        notes["os.libc"] = "partial"
        raise OSError("gone")

    monkeypatch.setattr(capture, "COLLECTORS", (("os", half_then_crash),))
    env = capture.collect_environment()
    assert env["os"] is None
    assert env["unavailable"] == {"os": "OSError: gone"}


# -- individual keys failing ---------------------------------------------------


def test_psutil_functions_raising_give_null_keys(monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("no sensor")

    for name in ("virtual_memory", "cpu_count", "cpu_freq"):
        monkeypatch.setattr(psutil, name, boom)
    env = capture.collect_environment()
    system = env["system"]
    for key in ("memory_total_bytes", "memory_available_bytes", "physical_cores",
                "logical_cores", "cpu_freq_current_mhz"):
        assert system[key] is None
        assert env["unavailable"][f"system.{key}"] == "RuntimeError: no sensor"
    assert len(system["load_average"]) == 3  # unaffected keys survive
    assert_contract(env)


def test_psutil_unknown_frequency_is_null_not_zero(monkeypatch):
    reading = types.SimpleNamespace(current=2400.0, min=0.0, max=0.0)
    monkeypatch.setattr(psutil, "cpu_freq", lambda: reading)
    notes = {}
    system = capture.collect_system(notes)
    assert system["cpu_freq_current_mhz"] == 2400.0
    assert system["cpu_freq_max_mhz"] is None
    assert "0 (unknown)" in notes["system.cpu_freq_max_mhz"]
    monkeypatch.setattr(psutil, "cpu_freq", lambda: None)
    notes = {}
    assert capture.collect_system(notes)["cpu_freq_min_mhz"] is None
    assert "not supported" in notes["system.cpu_freq_min_mhz"]


@pytest.mark.skipif(not ON_LINUX, reason="/proc and /sys are Linux facts")
def test_unreadable_proc_and_sys_give_null_keys(monkeypatch):
    real_open = builtins.open

    def guarded_open(file, *args, **kwargs):
        if str(file).startswith(("/proc", "/sys")):
            raise PermissionError(f"denied: {file}")
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    env = capture.collect_environment()
    unavailable = env["unavailable"]
    assert env["system"]["memory_total_bytes"] is None  # psutil reads /proc/meminfo
    assert "PermissionError" in unavailable["system.memory_total_bytes"]
    assert env["system"]["transparent_hugepage"] is None
    assert "PermissionError" in unavailable["system.transparent_hugepage"]
    assert_contract(env)


def test_sysfs_choice_parsing(tmp_path):
    path = tmp_path / "choice"
    for text, expected in [("always [madvise] never\n", "madvise"), ("performance\n", "performance")]:
        path.write_text(text)
        assert capture._read_sysfs_choice(str(path)) == expected
    for text in ["", "two words", "[] x"]:
        path.write_text(text)
        with pytest.raises(capture._Missing, match="malformed"):
            capture._read_sysfs_choice(str(path))


@pytest.mark.parametrize("raw, expected", [(65536, 65536), ("32 KiB", 32768), ("1 MiB", 1 << 20),
                                           ("512K", 524288), ("2 MB", 2 << 20), ("48", 48)])
def test_cache_size_parsing(raw, expected):
    assert capture._as_bytes(raw) == expected


@pytest.mark.parametrize("raw", [0, -1, True, "", "lots", "12 TB", None])
def test_cache_size_rejects_malformed(raw):
    with pytest.raises(capture._Missing):
        capture._as_bytes(raw)


def test_sparse_cpuinfo_gives_null_keys_with_reasons(monkeypatch):
    canned = {"brand_raw": "Test CPU", "arch": "X86_64", "bits": 64, "count": 8,
              "flags": ["avx2", "avx512f", "avx512_vnni", "made_up_flag"],
              "l1_data_cache_size": "48 KiB", "l2_cache_size": "lots",
              "hz_actual": [0, 0], "hz_actual_friendly": "0.0000 Hz"}
    monkeypatch.setattr(capture, "_cpuinfo", lambda: canned)
    notes = {}
    cpu = capture.collect_cpu(notes)
    assert cpu["brand"] == "Test CPU" and cpu["count"] == 8
    assert cpu["flags"] == ["avx2", "avx512f", "avx512_vnni"]
    assert (cpu["has_avx512"], cpu["has_vnni"], cpu["has_amx"]) == (True, True, False)
    assert cpu["l1d_cache_bytes"] == 48 * 1024
    assert cpu["vendor"] is None
    assert notes["cpu.vendor"] == "py-cpuinfo did not report vendor_id_raw"
    assert cpu["l2_cache_bytes"] is None and "malformed" in notes["cpu.l2_cache_bytes"]
    assert cpu["hz_actual"] is None and notes["cpu.hz_actual"] == "not reported"
    assert set(cpu) == set(capture._SECTION_KEYS["cpu"])


def test_cpuinfo_without_flags_nulls_flag_summaries(monkeypatch):
    monkeypatch.setattr(capture, "_cpuinfo", lambda: {"brand_raw": "X"})
    notes = {}
    cpu = capture.collect_cpu(notes)
    assert cpu["flags"] is None and cpu["has_avx2"] is None
    assert notes["cpu.has_avx2"] == "py-cpuinfo did not report flags"


def test_key_getter_raising_records_reason(monkeypatch):
    def boom():
        raise ValueError("bad libc")

    monkeypatch.setattr(platform, "libc_ver", boom)
    notes = {}
    assert capture.collect_os(notes)["libc"] is None
    assert notes == {"os.libc": "ValueError: bad libc"}


def test_torch_api_missing_costs_one_key(monkeypatch):
    monkeypatch.delattr(torch.backends.cpu, "get_cpu_capability")  # as in an older torch
    notes = {}
    section = capture.collect_torch(notes)
    assert section["cpu_capability"] is None
    assert notes["torch.cpu_capability"].startswith("AttributeError")
    assert section["intra_op_threads"] == torch.get_num_threads()


# -- environment variables -----------------------------------------------------


def test_thread_env_vars_captured(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("KMP_AFFINITY", "x")
    monkeypatch.setenv("UNRELATED_SETTING", "1")
    monkeypatch.setenv("NOT_OMP_NUM_THREADS", "9")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    env = capture.collect_environment()["env"]
    assert env["OMP_NUM_THREADS"] == "3"
    assert env["KMP_AFFINITY"] == "x"
    for name in ("UNRELATED_SETTING", "NOT_OMP_NUM_THREADS", "MKL_NUM_THREADS", "PATH", "HOME"):
        assert name not in env


# -- git -----------------------------------------------------------------------


@pytest.fixture
def fake_checkout(tmp_path, monkeypatch):
    """A git repository whose top holds a `kvbench` package; capture reads it."""
    package = tmp_path / "kvbench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _run(*GIT, "init", "--quiet", "--initial-branch=trunk", cwd=tmp_path)
    monkeypatch.setattr(kvbench, "__file__", str(package / "__init__.py"))
    return tmp_path


def test_git_without_commits_is_null_with_reason(fake_checkout):
    notes = {}
    info = capture.collect_kvbench(notes)
    assert info["git_commit"] is None and info["git_dirty"] is None
    assert notes["kvbench.git_commit"] == notes["kvbench.git_dirty"] == "no commits yet"
    assert info["git_branch"] == "trunk"  # an unborn branch still has a name


def test_git_commit_and_dirty_flag(fake_checkout):
    _run(*GIT, "add", ".", cwd=fake_checkout)
    _run(*GIT, "commit", "--quiet", "-m", "init", cwd=fake_checkout)
    head = _run("git", "rev-parse", "HEAD", cwd=fake_checkout)
    (fake_checkout / "scratch.txt").write_text("untracked")
    info = capture.collect_kvbench({})
    assert (info["git_commit"], info["git_dirty"], info["git_branch"]) == (head, False, "trunk")
    (fake_checkout / "kvbench" / "__init__.py").write_text("x = 1\n")
    assert capture.collect_kvbench({})["git_dirty"] is True
    _run("git", "checkout", "--quiet", "--detach", cwd=fake_checkout)
    notes = {}
    assert capture.collect_kvbench(notes)["git_branch"] is None
    assert notes["kvbench.git_branch"] == "detached HEAD"


def test_asvs_rewrite_of_its_benchmark_list_is_not_a_dirty_checkout(fake_checkout):
    """`asv run` rewrites the tracked results/asv/benchmarks.json every time: the code measured is unchanged."""
    listing = fake_checkout / "results" / "asv" / "benchmarks.json"
    listing.parent.mkdir(parents=True)
    listing.write_text('{"version": 2}\n')
    _run(*GIT, "add", ".", cwd=fake_checkout)
    _run(*GIT, "commit", "--quiet", "-m", "init", cwd=fake_checkout)
    listing.write_text('{\n "version": 2\n}\n')
    assert capture.collect_kvbench({})["git_dirty"] is False
    (fake_checkout / "kvbench" / "__init__.py").write_text("x = 1\n")
    assert capture.collect_kvbench({})["git_dirty"] is True


def test_package_outside_a_checkout(tmp_path, monkeypatch):
    package = tmp_path / "kvbench"
    package.mkdir()
    monkeypatch.setattr(kvbench, "__file__", str(package / "__init__.py"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    notes = {}
    info = capture.collect_kvbench(notes)
    assert info["version"]  # still known from the package itself
    assert info["git_commit"] is None
    assert "not a git repository" in notes["kvbench.git_commit"]


def test_package_nested_inside_another_repository(fake_checkout, monkeypatch):
    nested = fake_checkout / "site-packages" / "kvbench"
    nested.mkdir(parents=True)
    monkeypatch.setattr(kvbench, "__file__", str(nested / "__init__.py"))
    notes = {}
    assert capture.collect_kvbench(notes)["git_commit"] is None
    assert "is not a git checkout" in notes["kvbench.git_commit"]


def test_git_executable_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no git
    env = capture.collect_environment()
    for key in ("git_commit", "git_dirty", "git_branch"):
        assert env["kvbench"][key] is None
        assert env["unavailable"][f"kvbench.{key}"] == "git executable not found"
    assert_contract(env)


def test_git_timeout(monkeypatch):
    def hang(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout"))

    monkeypatch.setattr(capture.subprocess, "run", hang)
    notes = {}
    assert capture.collect_kvbench(notes)["git_commit"] is None
    assert notes["kvbench.git_commit"].startswith("TimeoutExpired")


# -- validation and summary ----------------------------------------------------


@pytest.mark.parametrize("path, value, problem", [
    ("torch.intra_op_threads", "2", "expected"),
    ("torch.intra_op_threads", True, "expected"),  # bool is not a thread count
    ("system.load_average", (0.1, 0.2, 0.3), "expected"),
    ("cpu.flags", [["avx2"]], "list items"),
    ("os.hostname", None, "None without a reason"),
    ("os.favourite_colour", "blue", "unknown key"),
    ("env.PATH", "/usr/bin", "not a captured variable"),
])
def test_validate_reports_problems(real_env, path, value, problem):
    env = json.loads(json.dumps(real_env))
    section, key = path.split(".")
    env[section][key] = value
    assert any(p.startswith(path) and problem in p for p in capture.validate_environment(env))


def test_validate_reports_missing_pieces(real_env):
    env = json.loads(json.dumps(real_env))
    del env["cpu"]
    env["torch"] = None
    del env["os"]["libc"]
    env["extra"] = 1
    problems = capture.validate_environment(env)
    assert "cpu: missing section" in problems
    assert "torch: None without a reason" in problems
    assert "os.libc: missing" in problems
    assert "extra: unknown top-level key" in problems
    env["timestamp_utc"] = "2026-01-01T00:00:00"  # naive: which zone?
    assert "timestamp_utc: not an ISO 8601 UTC time" in capture.validate_environment(env)
    assert capture.validate_environment({}) == [
        "unavailable: must map keys to non-empty reason strings"]


def test_summary(real_env):
    summary = capture.summarize_environment(real_env)
    assert list(summary) == list(capture.SUMMARY_KEYS)
    assert summary["torch_version"] == real_env["torch"]["version"]
    assert summary["cpu_capability"] == real_env["torch"]["cpu_capability"]
    assert summary["logical_cores"] == real_env["system"]["logical_cores"]
    partial = dict(real_env, torch=None)
    assert capture.summarize_environment(partial)["intra_op_threads"] is None
    assert set(capture.summarize_environment({}).values()) == {None}

