"""asv glue: the capture beside every asv result, `kvbench asv-machine`, `kvbench asv-show`.

asv writes one result file per machine, commit and environment:
``results/asv/<machine>/<commit[:8]>-<env>.json``. Beside each, kvbench keeps the
environment the benchmarks really ran in (``kvbench.measure.capture``, collected inside the
benchmarked environment by the suites' shared ``setup_cache``) at
``results/captures/<machine>/<same file name>`` -- a sibling of asv's results
folder, so asv never walks it and never mistakes it for results.

A benchmark process is not told its machine, and in an ``existing`` environment
not its commit or environment name either (asv 0.6 passes ASV_COMMIT,
ASV_ENV_NAME and ASV_CONF_DIR only to environments it builds). What is missing
is read from the `asv run` / `asv continuous` process that launched it (its
command line and working directory) and resolved the way asv resolves it; how
each value was found is recorded in the capture.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

RESULTS_DIR = Path("results") / "asv"  # asv.conf.json "results_dir"
CAPTURES_NAME = "captures"  # results/captures/, beside results/asv/
CAPTURE_SCHEMA = "kvbench.asv-capture/1"
SAVING_COMMANDS = ("run", "continuous")  # asv commands that write result files
ASV_METADATA_FILES = ("machine.json", "benchmarks.json")
# A folder under results/asv/ and a label on pages: never ".", "..", a path, or what a terminal or HTML interprets.
MACHINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class AsvToolError(ValueError):
    """A file or setting kvbench cannot use: reported as one line, exit status 2."""


class NoAsvRun(Exception):
    """This process is not part of an asv run whose results asv will save."""


# --- where things live -------------------------------------------------------


def captures_dir(results_dir: Path | str) -> Path:
    """results/asv -> results/captures."""
    return Path(results_dir).parent / CAPTURES_NAME


def result_file_name(commit_hash: str, env_name: str) -> str:
    """asv's own name for a result file (asv.results.get_filename, without the machine)."""
    if env_name and len(env_name) >= 128:
        env_name = "env-" + hashlib.md5(env_name.encode("utf-8")).hexdigest()
    return f"{commit_hash[:8]}-{env_name}.json"


def capture_path_for_result(result_path: Path | str) -> Path:
    """results/asv/<machine>/<file> -> results/captures/<machine>/<file>."""
    result_path = Path(result_path)
    machine_dir = result_path.parent
    return captures_dir(machine_dir.parent) / machine_dir.name / result_path.name


# --- which asv run is this? ---------------------------------------------------


@dataclass(frozen=True)
class AsvRun:
    """The keys of the result file this benchmark process contributes to."""

    machine: str
    commit_hash: str
    env_name: str
    conf_dir: Path
    results_dir: Path
    invocation: str | None = None  # "<pid>@<start time>" of the asv process
    command: list[str] | None = None
    sources: dict[str, str] = field(default_factory=dict)  # how each key was found

    @property
    def capture_path(self) -> Path:
        return captures_dir(self.results_dir) / self.machine / result_file_name(self.commit_hash, self.env_name)

    @property
    def result_path(self) -> Path:
        return self.results_dir / self.machine / result_file_name(self.commit_hash, self.env_name)


def asv_arguments(cmdline: list[str]) -> list[str] | None:
    """The arguments after `asv` in a command line, or None if it does not run asv."""
    for i, arg in enumerate(cmdline):
        if os.path.basename(arg) in ("asv", "asv.exe", "asv-script.py"):
            return cmdline[i + 1 :]
        if arg == "-m" and cmdline[i + 1 : i + 2] == ["asv"]:
            return cmdline[i + 2 :]
        if arg == "-masv":
            return cmdline[i + 1 :]
    return None


def parse_asv_command(args: list[str]) -> dict:
    """The options of an asv command line that decide where its results go."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--config")
    parser.add_argument("--machine", "-m")
    parser.add_argument("--set-commit-hash")
    parser.add_argument("--dry-run", "-n", action="store_true")
    parser.add_argument("--environment", "-E", action="append", default=[])
    parser.add_argument("--python", action="append", default=[])
    try:
        known, rest = parser.parse_known_args(args)
    except (argparse.ArgumentError, SystemExit) as error:
        raise NoAsvRun(f"cannot read the asv command line {args}: {error}") from None
    words = [word for word in rest if not word.startswith("-")]
    return {
        "command": words[0] if words else None,
        "config": known.config,
        "machine": known.machine,
        "set_commit_hash": known.set_commit_hash,
        "dry_run": known.dry_run,
        # asv turns `--python X` into the spec ":X" (even "same": its argparse action
        # compares a one-item list with "same"), and ":X" applies the matrix.
        "env_specs": [*known.environment, *(f":{python}" for python in known.python)],
    }


def find_asv_process(max_depth: int = 3):
    """(process, arguments after `asv`) of the nearest ancestor running asv, or (None, None).

    A benchmark is a child of asv (spawn) or a grandchild (forkserver).
    """
    import psutil

    try:
        process = psutil.Process()
        for _ in range(max_depth):
            process = process.parent()
            if process is None:
                break
            args = asv_arguments(process.cmdline())
            if args is not None:
                return process, args
    except psutil.Error:
        pass
    return None, None


def load_asv_conf(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        import json5  # asv's own reader allows comments; it is installed beside asv

        return json5.loads(text)


def resolve_machine(requested: str | None, machine_file: Path | None = None) -> str:
    """The machine name `asv run [--machine NAME]` uses (asv.machine.Machine.load)."""
    hostname = platform.uname().node
    name = requested or hostname
    known = read_machine_file(machine_file)
    if name in known:
        return known[name].get("machine") or name
    if len(known) == 1 and name == hostname:
        return next(iter(known.values())).get("machine") or name
    return name


def machine_file_path() -> Path:
    return Path(os.path.expanduser("~/.asv-machine.json"))


def read_machine_file(path: Path | None = None) -> dict[str, dict]:
    path = path or machine_file_path()
    if not path.is_file():  # missing, or a FIFO that would block the read
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {name: info for name, info in data.items() if name != "version" and isinstance(info, dict)}


def existing_env_name(executable: str, env_vars: dict[str, str] | None = None) -> str:
    """asv's name for an existing environment (ExistingEnvironment.name, asv.environment.get_env_name)."""
    parts = [f"existing-py{executable.replace(os.path.sep, '_')}"]
    parts += [f"{key}{value}" for key, value in sorted((env_vars or {}).items())]
    return re.sub('[<>:"/\\^|?*\x00-\x1f]', "_", "-".join(parts))  # as asv.util.sanitize_filename


def matrix_env_vars(specs: list[str], conf: dict, environ) -> dict[str, str]:
    """The matrix variables in an existing environment's name.

    asv applies the matrix's env/env_nobuild to an existing environment only when its
    spec has no type (":python", "--python=same"); "existing:python" ignores the matrix.
    The values are the ones asv set in this process's environment.
    """
    typed = [spec.split(":", 1)[0] for spec in specs if spec.split(":", 1)[0] in ("", "existing")]
    if "" not in typed or "existing" in typed:  # none, or ambiguous: asv's default is no matrix
        return {}
    matrix = conf.get("matrix") or {}
    names = {*(matrix.get("env") or {}), *(matrix.get("env_nobuild") or {})}
    return {name: environ[name] for name in names if name in environ}


def _git_commit(repo: Path, name: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                          capture_output=True, text=True, timeout=10, check=False)
    commit = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise NoAsvRun(f"cannot resolve --set-commit-hash {name!r} in {repo}")
    return commit


def current_asv_run(environ: dict | None = None) -> AsvRun:
    """The asv run this process belongs to; NoAsvRun if asv will save no result for it."""
    environ = os.environ if environ is None else environ
    process, args = find_asv_process()
    options = parse_asv_command(args) if args is not None else {}
    sources = {}
    if process is not None:
        if options["command"] not in SAVING_COMMANDS:
            raise NoAsvRun(f"`asv {options['command']}` saves no results")
        if options["dry_run"]:
            raise NoAsvRun("`asv run --dry-run` saves no results")

    existing = "ASV_ENV_NAME" not in environ  # asv passes ASV_* only to environments it builds
    if "ASV_CONF_DIR" in environ:
        conf_dir, sources["conf_dir"] = Path(environ["ASV_CONF_DIR"]), "ASV_CONF_DIR"
    elif process is not None:
        conf_dir, sources["conf_dir"] = Path(process.cwd()), "cwd of the asv process"
    else:
        raise NoAsvRun("no ASV_CONF_DIR and no asv process among this process's parents")
    conf_path = conf_dir / Path(options.get("config") or "asv.conf.json").name
    if not conf_path.is_file() and conf_path.name == "asv.conf.json":
        conf_path = conf_dir / "asv.conf.jsonc"
    conf = load_asv_conf(conf_path)
    results_dir = conf_dir / conf.get("results_dir", "results")

    if not existing:
        env_name, sources["env_name"] = environ["ASV_ENV_NAME"], "ASV_ENV_NAME"
    else:
        env_vars = matrix_env_vars(options.get("env_specs", []), conf, environ)
        env_name = existing_env_name(sys.executable, env_vars)
        sources["env_name"] = "existing environment: sys.executable" + (" and the matrix's env vars" if env_vars else "")
    if "ASV_COMMIT" in environ:
        commit, sources["commit_hash"] = environ["ASV_COMMIT"], "ASV_COMMIT"
    elif options.get("set_commit_hash"):
        commit = _git_commit(conf_dir / conf.get("repo", "."), options["set_commit_hash"])
        sources["commit_hash"] = "--set-commit-hash of the asv process"
    elif existing:
        raise NoAsvRun("an existing environment without --set-commit-hash saves no results")
    else:
        raise NoAsvRun("no ASV_COMMIT for this environment")

    machine = resolve_machine(options.get("machine"))
    sources["machine"] = ("--machine of the asv process, " if options.get("machine") else "") + \
        "resolved through ~/.asv-machine.json like asv"
    invocation = None
    if process is not None:
        invocation = f"{process.pid}@{process.create_time():.2f}"
    return AsvRun(machine=machine, commit_hash=commit, env_name=env_name, conf_dir=conf_dir,
                  results_dir=results_dir, invocation=invocation,
                  command=["asv", *args] if args is not None else None, sources=sources)


# --- the capture -------------------------------------------------------------


def write_capture(run: AsvRun, environment: dict | None = None) -> Path:
    """Write the capture for `run`'s result file atomically; return its path."""
    from kvbench.measure import capture

    path = run.capture_path
    document = {
        "schema": CAPTURE_SCHEMA,
        "machine": run.machine,
        "commit_hash": run.commit_hash,
        "env_name": run.env_name,
        "result_file": f"{run.machine}/{result_file_name(run.commit_hash, run.env_name)}",
        "asv": {"invocation": run.invocation, "command": run.command, "sources": run.sources},
        "environment": capture.collect_environment() if environment is None else environment,
    }
    return json_writer()(document, path, force=True)  # concurrent writers: the last complete file wins


def json_writer():
    """kvbench's atomic JSON writer. This file also runs from the checkout against older commits'
    kvbench (see benchmarks/common.py), whose writer lived in kvbench.record."""
    try:
        from kvbench.files import write_json_atomic
    except ImportError:
        from kvbench.files import write_json_atomic
    return write_json_atomic


def capture_beside_results() -> Path | None:
    """Called once per commit and environment (the suites' shared setup_cache).

    Writes the capture unless this asv invocation already has; never raises, so
    a broken capture can never cost the benchmarks. Returns the path written.
    """
    try:
        run = current_asv_run()
        path = run.capture_path
        if run.invocation is not None and path.is_file():
            try:
                if json.loads(path.read_text())["asv"]["invocation"] == run.invocation:
                    return None  # a later round of the same `asv run`
            except (ValueError, KeyError, TypeError, OSError):
                pass  # unreadable: replace it
        return write_capture(run)
    except NoAsvRun as reason:
        print(f"kvbench: no capture written: {reason}", file=sys.stderr)
    except Exception as error:  # noqa: BLE001 - the benchmarks must run regardless
        print(f"kvbench: capture failed: {type(error).__name__}: {error}", file=sys.stderr)
    return None


def annotate_capture(section: str, key: str, value: dict) -> Path | None:
    """Add `value` under capture[section][key] of this asv run's capture (a benchmark's own
    facts beside the environment, e.g. the precision a track_speedup reached). Never raises."""
    try:
        run = current_asv_run()
        path = run.capture_path
        document = json.loads(path.read_text()) if path.is_file() else None
        if not isinstance(document, dict) or document.get("schema") != CAPTURE_SCHEMA:
            return None  # setup_cache writes the capture first; without one there is nothing to annotate
        document.setdefault(section, {})[key] = value
        return json_writer()(document, path, force=True)
    except NoAsvRun:
        return None
    except Exception as error:  # noqa: BLE001 - the benchmarks must run regardless
        print(f"kvbench: capture annotation failed: {type(error).__name__}: {error}", file=sys.stderr)
        return None


def load_capture(path: Path | str) -> dict:
    """Read and check a capture file; AsvToolError naming the first problem."""
    from kvbench.measure import capture

    path = Path(path)
    document = read_json_file(path, "capture")
    if not isinstance(document, dict) or document.get("schema") != CAPTURE_SCHEMA:
        found = document.get("schema") if isinstance(document, dict) else type(document).__name__
        raise AsvToolError(f"{path}: not a kvbench asv capture: expected schema {CAPTURE_SCHEMA!r}, got {found!r}")
    for key in ("machine", "commit_hash", "env_name", "result_file", "environment"):
        if key not in document:
            raise AsvToolError(f"{path}: missing key {key!r}")
    problems = capture.validate_environment(document["environment"]) if isinstance(document["environment"], dict) \
        else ["environment: expected an object"]
    if problems:
        raise AsvToolError(f"{path}: invalid environment: {problems[0]}")
    return document


def read_json_file(path: Path, what: str, finite: bool = True):
    """A capture or result file, read as kvbench reads records: a regular file, bounded JSON (finite numbers
    only, unless not `finite`)."""
    # Imported here: this module also runs from the checkout against older commits' kvbench
    # (see benchmarks/common.py), which have no kvbench.files; only the CLI reads files.
    from kvbench.files import UnreadableFileError, read_json

    try:
        return read_json(path, f"asv {what} file", finite=finite)
    except UnreadableFileError as error:
        raise AsvToolError(str(error)) from None


# --- kvbench asv-machine ---------------------------------------------------------


def machine_info(name: str | None, environment: dict) -> dict:
    """asv's machine fields, filled from a kvbench capture (strings, as asv stores them)."""
    def get(section: str, key: str):
        holder = environment.get(section)
        value = holder.get(key) if isinstance(holder, dict) else None
        return "" if value is None else str(value)

    os_name = " ".join(filter(None, (get("os", "system"), get("os", "release"))))
    return {
        "machine": name if name is not None else get("os", "hostname") or platform.uname().node,
        "os": os_name,
        "arch": get("os", "machine"),
        "cpu": get("cpu", "brand"),
        "num_cpu": get("system", "logical_cores"),
        "ram": get("system", "memory_total_bytes"),
    }


def register_machine(name: str | None = None, environment: dict | None = None) -> tuple[dict, bool]:
    """Save the machine to ~/.asv-machine.json, as `asv machine --yes` would; (info, replaced)."""
    from asv.machine import MachineCollection

    from kvbench.measure import capture

    info = machine_info(name, capture.collect_environment() if environment is None else environment)
    if not MACHINE_NAME.fullmatch(info["machine"]):
        raise AsvToolError("machine name must be a plain word of at most 64 ASCII letters, digits, '_' or '-', first a "
                           f"letter or digit (it names results/asv/NAME/), got {info['machine']!r}"
                           + ("" if name is not None else "; pass --name NAME"))
    path = machine_file_path()
    if os.path.lexists(path) and not os.path.isfile(path):  # asv would block on a FIFO, or fail on a directory
        raise AsvToolError(f"{path} is not a regular file; asv keeps its machines there")
    replaced = info["machine"] in read_machine_file()
    try:
        MachineCollection.save(info["machine"], info)
    except Exception as error:  # noqa: BLE001 - asv raises UserError, ValueError, OSError for a bad machine file
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise AsvToolError(f"{path}: asv cannot use it: {message}") from None
    return info, replaced
