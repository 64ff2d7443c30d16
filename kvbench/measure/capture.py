"""Environment capture for benchmark records.

One ``collect_<source>`` function per source, called in order by
``collect_environment``. A source that cannot be read becomes ``None`` and a
key that cannot be read becomes ``None``; either way the reason is kept in the
top-level ``"unavailable"`` dict (keyed ``"section"`` or ``"section.key"``), so
a missing sensor never costs a benchmark run and never passes silently.
"""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

GIT_TIMEOUT_S = 3.0

# Flags that decide which torch / oneDNN CPU kernels run (x86 and Arm names as
# /proc/cpuinfo spells them); the full list is ~100 entries of noise.
KERNEL_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
    "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
    "amx_bf16", "amx_int8", "amx_tile",
    "neon", "asimd", "asimddp", "asimdhp", "bf16", "i8mm", "sve", "sve2",
)
FLAG_SUMMARY = {  # summary key -> any of these flags
    "has_avx2": ("avx2",),
    "has_avx512": ("avx512f",),
    "has_avx512_bf16": ("avx512_bf16",),
    "has_vnni": ("avx512_vnni", "avx_vnni"),
    "has_amx": ("amx_tile",),
    "has_neon": ("neon", "asimd"),
    "has_sve": ("sve",),
}

# Thread pools (OpenMP, MKL, OpenBLAS, ...) read these at start-up, so the same
# code runs at a different width; ATen/oneDNN ISA overrides change the kernels.
ENV_NAMES = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS",
    "TORCH_NUM_THREADS", "ATEN_CPU_CAPABILITY", "DNNL_MAX_CPU_ISA", "ONEDNN_MAX_CPU_ISA",
)
ENV_PREFIXES = ("KMP_", "GOMP_", "OMP_", "MKL_", "OPENBLAS_")

_NONE = type(None)
_SECTION_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "python": {"implementation": str, "version": str, "build": list,
               "compiler": str, "executable": str},
    "torch": {"version": str, "git_version": str, "debug": bool,
              "cuda": (str, _NONE),  # None is a fact here: a CPU-only build
              "parallel_info": str, "config_show": str,
              "intra_op_threads": int, "inter_op_threads": int,
              "mkl_available": bool, "mkldnn_available": bool, "openmp_available": bool,
              "cpu_capability": str, "default_dtype": str,
              "float32_matmul_precision": str, "deterministic_algorithms": bool},
    "cpu": {"brand": str, "vendor": str, "arch": str, "bits": int, "count": int,
            "flags": list, **{k: bool for k in FLAG_SUMMARY},
            "l1d_cache_bytes": int, "l2_cache_bytes": int, "l3_cache_bytes": int,
            "hz_advertised_friendly": str, "hz_advertised": int,
            "hz_actual_friendly": str, "hz_actual": int},
    "system": {"physical_cores": int, "logical_cores": int, "cpu_affinity": list,
               "cpu_freq_current_mhz": float, "cpu_freq_min_mhz": float,
               "cpu_freq_max_mhz": float, "memory_total_bytes": int,
               "memory_available_bytes": int, "load_average": list,
               "cpu_governor": str, "transparent_hugepage": str},
    "os": {"platform": str, "system": str, "release": str, "version": str,
           "machine": str, "libc": str, "hostname": str},
    "kvbench": {"version": str, "git_commit": str, "git_dirty": bool, "git_branch": str},
}
# The promised keys and their types: "section.key" -> type(s); `env` is open-ended.
KEY_TYPES: dict[str, type | tuple[type, ...]] = {
    "timestamp_utc": str,
    **{f"{s}.{k}": t for s, keys in _SECTION_KEYS.items() for k, t in keys.items()},
}
_ABSENT = object()


class _Missing(Exception):
    """A value the source does not report; the message is the whole reason."""


def _reason(exc: BaseException) -> str:
    if isinstance(exc, _Missing):
        return str(exc)
    text = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    return text.splitlines()[0][:200]


def _fill(section: str, getters: dict[str, Callable[[], Any]], notes: dict) -> dict:
    """Call each getter; a failure or an unexpected None becomes None plus a reason."""
    out = {}
    for key, get in getters.items():
        try:
            value = get()
            if value is None and not _type_ok(None, KEY_TYPES[f"{section}.{key}"]):
                raise _Missing("not reported")
        except Exception as exc:  # any sensor may break; the record must not
            value = None
            notes[f"{section}.{key}"] = _reason(exc)
        out[key] = value
    return out


def _type_ok(value: Any, expected: type | tuple[type, ...]) -> bool:
    expected = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool) and bool not in expected:
        return False  # bool is an int subclass; a True thread count is a bug
    return isinstance(value, expected)


def collect_python(notes: dict) -> dict:
    return _fill("python", {
        "implementation": platform.python_implementation,
        "version": platform.python_version,
        "build": lambda: list(platform.python_build()),
        "compiler": platform.python_compiler,
        "executable": lambda: sys.executable or None,
    }, notes)


def collect_torch(notes: dict) -> dict:
    import torch

    return _fill("torch", {
        "version": lambda: str(torch.__version__),
        "git_version": lambda: torch.version.git_version,
        "debug": lambda: bool(torch.version.debug),
        "cuda": lambda: torch.version.cuda,
        # Lambdas, not bound methods: an API missing from an older torch must
        # cost one key, not the whole section.
        "parallel_info": lambda: torch.__config__.parallel_info(),
        "config_show": lambda: torch.__config__.show(),
        "intra_op_threads": lambda: torch.get_num_threads(),
        "inter_op_threads": lambda: torch.get_num_interop_threads(),
        "mkl_available": lambda: torch.backends.mkl.is_available(),
        "mkldnn_available": lambda: torch.backends.mkldnn.is_available(),
        "openmp_available": lambda: torch.backends.openmp.is_available(),
        "cpu_capability": lambda: torch.backends.cpu.get_cpu_capability(),
        "default_dtype": lambda: str(torch.get_default_dtype()).removeprefix("torch."),
        "float32_matmul_precision": lambda: torch.get_float32_matmul_precision(),
        "deterministic_algorithms": lambda: torch.are_deterministic_algorithms_enabled(),
    }, notes)


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> dict:
    # get_cpu_info() spawns a helper process (~1 s); the CPU does not change
    # within a process. A raised error is not cached, so a later call retries.
    import cpuinfo

    return cpuinfo.get_cpu_info()


def _as_bytes(value: Any) -> int:
    # py-cpuinfo gives ints on Linux but "32 KiB"-style strings on some paths.
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*", str(value), re.IGNORECASE)
    if not m:
        raise _Missing(f"malformed cache size {value!r}")
    size = int(float(m[1]) * 1024 ** " KMG".index(m[2].upper() or " "))
    if size <= 0:
        raise _Missing(f"malformed cache size {value!r}")
    return size


def collect_cpu(notes: dict) -> dict:
    info = _cpuinfo()

    def get(key: str) -> Any:
        if info.get(key) in (None, "", [], 0):
            raise _Missing(f"py-cpuinfo did not report {key}")
        return info[key]

    def has(flags: tuple[str, ...]) -> Callable[[], bool]:
        return lambda: any(f in get("flags") for f in flags)

    return _fill("cpu", {
        "brand": lambda: get("brand_raw"),
        "vendor": lambda: get("vendor_id_raw"),
        "arch": lambda: get("arch"),
        "bits": lambda: get("bits"),
        "count": lambda: get("count"),
        "flags": lambda: [f for f in KERNEL_FLAGS if f in get("flags")],
        **{key: has(flags) for key, flags in FLAG_SUMMARY.items()},
        "l1d_cache_bytes": lambda: _as_bytes(get("l1_data_cache_size")),
        "l2_cache_bytes": lambda: _as_bytes(get("l2_cache_size")),
        "l3_cache_bytes": lambda: _as_bytes(get("l3_cache_size")),
        # (integer Hz, fractional digits) pairs; the fraction is below resolution.
        "hz_advertised_friendly": lambda: get("hz_advertised_friendly"),
        "hz_advertised": lambda: int(get("hz_advertised")[0]) or None,
        "hz_actual_friendly": lambda: get("hz_actual_friendly"),
        "hz_actual": lambda: int(get("hz_actual")[0]) or None,
    }, notes)


def _read_sysfs_choice(path: str) -> str:
    # sysfs lists choices as "always [madvise] never"; the bracketed one is active.
    with open(path, encoding="ascii") as f:
        text = f.read().strip()
    m = re.search(r"\[(\w+)\]", text)
    value = m[1] if m else text
    if not re.fullmatch(r"[\w-]+", value):
        raise _Missing(f"malformed {path}: {text!r}")
    return value


def collect_system(notes: dict) -> dict:
    import psutil

    def freq(field: str) -> float:
        reading = psutil.cpu_freq()
        if reading is None:
            raise _Missing("psutil.cpu_freq() is not supported here")
        if not getattr(reading, field):  # psutil's way of saying "unknown"
            raise _Missing(f"psutil reports the {field} frequency as 0 (unknown)")
        return float(getattr(reading, field))

    return _fill("system", {
        "physical_cores": lambda: psutil.cpu_count(logical=False),
        "logical_cores": lambda: psutil.cpu_count(logical=True),
        "cpu_affinity": lambda: sorted(psutil.Process().cpu_affinity()),
        "cpu_freq_current_mhz": lambda: freq("current"),
        "cpu_freq_min_mhz": lambda: freq("min"),
        "cpu_freq_max_mhz": lambda: freq("max"),
        "memory_total_bytes": lambda: psutil.virtual_memory().total,
        "memory_available_bytes": lambda: psutil.virtual_memory().available,
        "load_average": lambda: [float(x) for x in
                                 (os.getloadavg() if hasattr(os, "getloadavg")
                                  else psutil.getloadavg())],
        # A "powersave" governor or THP policy can move timings more than the code.
        "cpu_governor": lambda: _read_sysfs_choice(
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "transparent_hugepage": lambda: _read_sysfs_choice(
            "/sys/kernel/mm/transparent_hugepage/enabled"),
    }, notes)


def collect_os(notes: dict) -> dict:
    return _fill("os", {
        "platform": platform.platform,
        "system": platform.system,
        "release": platform.release,
        "version": platform.version,
        "machine": platform.machine,
        "libc": lambda: " ".join(filter(None, platform.libc_ver())) or None,
        "hostname": socket.gethostname,
    }, notes)


def collect_env(notes: dict) -> dict:
    return {name: value for name, value in sorted(os.environ.items())
            if name in ENV_NAMES or name.startswith(ENV_PREFIXES)}


# Tracked files a tool rewrites on every run, which say nothing of the code measured: `asv run` rewrites its list of
# benchmarks in asv.conf.json's results_dir (the same list, re-serialised) every time, so the capture of the next
# run after `make asv-quick` read git_dirty: true for a checkout whose every line of code was committed.
REWRITTEN_BY_TOOLS = ("results/asv/benchmarks.json",)


def _git(root: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                          text=True, timeout=GIT_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise _Missing(proc.stderr.strip().splitlines()[0] if proc.stderr.strip()
                       else f"git {args[0]} exited with status {proc.returncode}")
    return proc.stdout.strip()


def collect_kvbench(notes: dict) -> dict:
    import kvbench

    root = Path(kvbench.__file__).resolve().parent.parent
    try:
        # Only the checkout that *is* the package's parent counts: an installed
        # copy inside some other repository must not report that repo's commit.
        top = Path(_git(root, "rev-parse", "--show-toplevel")).resolve()
        checkout_error = None if top == root else _Missing(f"{root} is not a git checkout")
    except FileNotFoundError:
        checkout_error = _Missing("git executable not found")
    except Exception as exc:
        checkout_error = exc

    def git(*args: str, failure: str | None = None) -> str:
        if checkout_error is not None:
            raise checkout_error
        try:
            return _git(root, *args)
        except _Missing as exc:
            raise (_Missing(failure) if failure else exc) from None

    def commit() -> str:
        return git("rev-parse", "--verify", "--quiet", "HEAD", failure="no commits yet")

    def branch() -> str:
        return git("symbolic-ref", "--short", "--quiet", "HEAD", failure="detached HEAD")

    def dirty() -> bool:
        commit()  # "dirty" means nothing without a commit to differ from
        # Untracked files (results, scratch) do not change what was benchmarked, nor do the tracked files a
        # tool rewrites as it runs (REWRITTEN_BY_TOOLS).
        return bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                        *(f":(exclude){path}" for path in REWRITTEN_BY_TOOLS)))

    return _fill("kvbench", {
        "version": lambda: getattr(kvbench, "__version__", None)
        or importlib.metadata.version("kvbench"),
        "git_commit": commit,
        "git_dirty": dirty,
        "git_branch": branch,
    }, notes)


COLLECTORS: tuple[tuple[str, Callable[[dict], dict]], ...] = (
    ("python", collect_python), ("torch", collect_torch), ("cpu", collect_cpu),
    ("system", collect_system), ("os", collect_os), ("env", collect_env),
    ("kvbench", collect_kvbench),
)
SECTIONS = tuple(name for name, _ in COLLECTORS)


def collect_environment() -> dict:
    """Return {timestamp_utc, <section>: dict | None ..., unavailable: {key: reason}}."""
    now = datetime.datetime.now(datetime.timezone.utc)
    env: dict[str, Any] = {"timestamp_utc": now.isoformat(timespec="seconds")}
    unavailable: dict[str, str] = {}
    for name, collect in COLLECTORS:
        notes: dict[str, str] = {}
        try:
            env[name] = collect(notes)
            unavailable.update(notes)
        except Exception as exc:  # one broken source must not cost the rest
            env[name] = None
            unavailable[name] = _reason(exc)
    env["unavailable"] = unavailable
    return env


def validate_environment(env: dict) -> list[str]:
    """Return the problems in a captured environment; an empty list means valid."""
    problems = []
    unavailable = env.get("unavailable")
    if not isinstance(unavailable, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in unavailable.items()):
        return ["unavailable: must map keys to non-empty reason strings"]
    for key in set(env) - {"timestamp_utc", "unavailable", *SECTIONS}:
        problems.append(f"{key}: unknown top-level key")
    for name in SECTIONS:
        section = env.get(name, _ABSENT)
        if section is _ABSENT:
            problems.append(f"{name}: missing section")
        elif section is None:
            if name not in unavailable:
                problems.append(f"{name}: None without a reason")
        elif not isinstance(section, dict):
            problems.append(f"{name}: expected dict or None, got {type(section).__name__}")
        elif name == "env":
            problems += [f"env.{k}: not a captured variable or not a str" for k, v in section.items()
                         if not isinstance(v, str) or not (
                             k in ENV_NAMES or k.startswith(ENV_PREFIXES))]
        else:
            problems += [f"{name}.{k}: unknown key" for k in set(section) - set(_SECTION_KEYS[name])]
    for path, expected in KEY_TYPES.items():
        name, _, key = path.rpartition(".")
        holder = env.get(name) if name else env
        if not isinstance(holder, dict):
            continue  # the whole section is absent, reported above
        value = holder.get(key, _ABSENT)
        if value is _ABSENT:
            problems.append(f"{path}: missing")
        elif value is None and not _type_ok(None, expected):
            if path not in unavailable:
                problems.append(f"{path}: None without a reason")
        elif not _type_ok(value, expected):
            problems.append(f"{path}: expected {expected}, got {value!r}")
        elif isinstance(value, list) and not all(
                isinstance(x, (str, int, float)) for x in value):
            problems.append(f"{path}: list items must be str, int or float")
    try:  # records are compared across machines: the clock must be explicit UTC
        offset = datetime.datetime.fromisoformat(
            str(env.get("timestamp_utc")).replace("Z", "+00:00")).utcoffset()
    except ValueError:
        offset = None
    if offset != datetime.timedelta(0):
        problems.append("timestamp_utc: not an ISO 8601 UTC time")
    return problems


SUMMARY_KEYS = {  # short name -> "section.key"; the facts that most move timings
    "python_version": "python.version",
    "torch_version": "torch.version",
    "torch_git_version": "torch.git_version",
    "cpu_brand": "cpu.brand",
    "cpu_capability": "torch.cpu_capability",
    "intra_op_threads": "torch.intra_op_threads",
    "inter_op_threads": "torch.inter_op_threads",
    "logical_cores": "system.logical_cores",
    "memory_total_bytes": "system.memory_total_bytes",
    "platform": "os.platform",
}


def summarize_environment(env: dict) -> dict:
    """A flat dict of SUMMARY_KEYS for tables and comparisons; missing -> None."""
    out = {}
    for short, path in SUMMARY_KEYS.items():
        section, key = path.split(".")
        holder = env.get(section)
        out[short] = holder.get(key) if isinstance(holder, dict) else None
    return out
