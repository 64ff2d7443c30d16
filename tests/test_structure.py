"""The shape of the code, checked: imports run down the layers, no cycles, rooms a newcomer can read,
the new import paths in kvbench's own code and the old ones still working for everybody else's.

Every module of kvbench is parsed with `ast`, imports inside functions included, so neither a
cycle nor an import up the layers can hide behind a late import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvbench"
MAX_MODULE_LINES = 420  # "about 400"
MAX_FUNCTION_LINES = 60
LONG_MARK = "# long:"  # a function may run longer when a comment on its def line or above says why


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path) -> set[str]:
    """kvbench modules that `name` imports anywhere in its file (a `from x import y` of a
    submodule y counts as an import of x.y). A module's own packages are left out: they are
    imported before it runs, whatever it writes, so naming one (`from kvbench.serving import
    admission` in kvbench.serving.scheduler) adds no dependency; a package's `__getattr__`
    that imports one of its modules on first use (kvbench.serving) is then no cycle."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module in MODULES and module != name and not name.startswith(module + ".")}


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def test_the_graph_sees_imports_inside_functions():
    assert "kvbench.report.record.plots" in GRAPH["kvbench.cli.commands"]  # imported where it is used
    assert "kvbench.cache" in GRAPH["kvbench.model"] and "kvbench.config" in GRAPH["kvbench.cache.base"]


def test_no_import_cycle():
    state: dict[str, str] = {}

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for target in sorted(GRAPH[module]):
            if state.get(target) == "open":
                cycle = trail[trail.index(target):] + [target] if target in trail else [module, target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, [*trail, target])
        state[module] = "done"

    for module in MODULES:
        if module not in state:
            visit(module, [module])


# The layers, bottom up. A module may import modules of its own layer and of the layers listed before it, never
# of one listed after it, imports inside functions included (docs/architecture.md says why each sits where it does).
LAYERS = (
    ("kvbench", "kvbench.config", "kvbench.kinds", "kvbench.modes", "kvbench.files", "kvbench.budget",
     "kvbench.plugins"),  # the floor: configuration, the modes as data, files; torch-free
    ("kvbench.measure",),  # the protocol, timing, sampling, telemetry, statistics, the environment: no model
    ("kvbench.attention",),
    ("kvbench.cache",),
    ("kvbench.model",),
    ("kvbench.models",),  # transformers', GGUF files, the corpus, compiled steps: other people's models
    ("kvbench.workloads",),  # the loops, the gate, requests, contexts, one run end to end, quality
    ("kvbench.serving",),  # many requests under a budget
    ("kvbench.record", "kvbench.asvtools"),  # what a run leaves: the record, asv's captures
    ("kvbench.report",),
    ("kvbench.export",),
    ("kvbench.cli", "kvbench.__main__"),
)


def layer_of(module: str) -> int:
    found = [index for index, layer in enumerate(LAYERS) for top in layer
             if module == top or (top != "kvbench" and module.startswith(top + "."))]
    assert len(found) == 1, f"{module} must be in one layer of LAYERS, found in {len(found)}"
    return found[0]


def test_every_module_has_one_layer():
    """A new module or package takes its place in LAYERS, and then the order holds for it too."""
    for module in MODULES:
        layer_of(module)
    assert sorted(name for layer in LAYERS for name in layer if name not in MODULES) == []


def test_imports_run_down_the_layers_never_up():
    upward = [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
              for module, targets in sorted(GRAPH.items()) for target in sorted(targets)
              if layer_of(target) > layer_of(module)]
    assert upward == []


def test_the_layer_check_sees_a_late_import_upward(tmp_path):
    late = tmp_path / "timing.py"
    late.write_text("def profile():\n    from kvbench.workloads.decode import steps\n")
    targets = imported_modules("kvbench.measure.timing", late)
    assert targets == {"kvbench.workloads.decode"} and layer_of("kvbench.workloads.decode") > layer_of(
        "kvbench.measure.timing")


def test_the_top_level_stays_small():
    """Packages by concern: at most 12 modules at the top of kvbench/, __init__ and __main__ counted."""
    assert len(list(PACKAGE.glob("*.py"))) <= 12


def test_nothing_imports_the_cli():
    importers = [name for name, targets in GRAPH.items() if any(t.startswith("kvbench.cli") for t in targets)
                 and not name.startswith("kvbench.cli") and name != "kvbench.__main__"]
    assert importers == []


@pytest.mark.parametrize("root", ["kvbench", "benchmarks", "scripts"])
def test_no_module_imports_another_modules_underscore_names(root):
    offenders = []
    for path in sorted((ROOT / root).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                offenders += [f"{path.relative_to(ROOT)}: {alias.name}" for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id not in ("self", "cls", "child", "other"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {owner.id}.{node.attr}")
    assert offenders == []


@pytest.mark.parametrize("root", ["kvbench", "benchmarks", "scripts"])
def test_modules_and_functions_stay_readable_in_one_sitting(root):
    too_long = []
    for path in sorted((ROOT / root).rglob("*.py")):
        lines = path.read_text().splitlines()
        if len(lines) > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {len(lines)} lines")
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                explained = any(LONG_MARK in line for line in lines[max(0, first - 3): node.lineno])
                if length > MAX_FUNCTION_LINES and not explained:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []


def test_the_bytes_a_mode_retains_have_one_answer():
    """kvbench.modes.expected_bytes is the only byte formula by mode: no cache class, no other module keeps one."""
    import re

    definitions = [f"{path.relative_to(ROOT)}: {match}" for root in ("kvbench", "benchmarks", "scripts")
                   for path in sorted((ROOT / root).rglob("*.py"))
                   for match in re.findall(r"def (\w*expected_bytes|formula_bytes)\(", path.read_text())]
    assert definitions == ["kvbench/modes.py: expected_bytes"]
    from kvbench.cache import KINDS
    from kvbench.modes import CACHE_KINDS, SPECS

    assert tuple(KINDS)[: len(CACHE_KINDS)] == CACHE_KINDS
    assert all(SPECS[kind].cache_factory() is KINDS[kind] and SPECS[kind].bytes is not None for kind in CACHE_KINDS)


# A switch on a mode's name: `== FULL`, `!= "window"`, `in HF_MODES` and the like. What a mode is and does is its
# spec's (kvbench.modes); the few left outside it say why on their line.
def mode_switch() -> re.Pattern:
    """A test of a kind or mode by its name, for every mode the registry ships (and the constants that name them):
    compared (==, !=), looked up in a literal tuple or list, tested by prefix, or sought among the run's kinds."""
    from kvbench import modes
    from kvbench.models import compiled

    quoted = "|".join(sorted((re.escape(f'"{name}"') for name in modes.RUNNABLE), key=len, reverse=True))
    constants = "FULL|STATIC_COMPILED|HF_STATIC_COMPILED"
    assert {modes.FULL, compiled.STATIC_COMPILED, compiled.HF_STATIC_COMPILED} <= set(modes.RUNNABLE)
    prefixes = "|".join(sorted({re.escape(name.split("-")[0]) for name in modes.RUNNABLE if "-" in name}))
    name = rf'(?:(?:kinds|registry|modes|compiled)\.)?(?:{constants})\b|{quoted}'
    return re.compile(rf'(==|!=) ?({name})|({name}) ?(==|!=)|\b(?:if|elif|and|or|return)\b[^#]* in [(\[][^)\]]*({name})|startswith\("({prefixes})'
                      rf'|({quoted}) (not )?in (kinds|modes|args\.modes)\b|(not )?in (kinds\.|modes\.)?HF_MODES')


MODE_SWITCH = mode_switch()


def test_modes_are_not_switched_on_by_name_outside_the_registry():
    found, unexplained = [], []
    for root in ("kvbench", "benchmarks"):
        for path in sorted((ROOT / root).rglob("*.py")):
            lines = path.read_text().splitlines() if path.name != "modes.py" else []
            for number, line in enumerate(lines):
                if MODE_SWITCH.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number + 1}: {line.strip()}")
                    if "#" not in line and "#" not in lines[number - 1]:  # the why, on its line or the one above
                        unexplained.append(found[-1])
    # Only asv's fallback for commits before the registry (benchmarks/common.py) may name a kind.
    assert len(found) <= 1 and unexplained == [], found


def old_paths(path: Path) -> list[str]:
    """Where a file names a module by a path kvbench.MOVED or kvbench.PACKAGES retired: an import of it, an
    import of an old module's name from the package it became, or a "module:attribute" string. In benchmarks/,
    the fallback of a guarded import (inside `except ImportError`) is allowed: asv runs today's suites on
    commits from before the packages."""
    import importlib

    import kvbench

    forwarded = {f"{package}.{name}" for package in kvbench.PACKAGES
                 for name in importlib.import_module(package).OLD_NAMES}
    tree = ast.parse(path.read_text())
    fallbacks = set()
    if path.is_relative_to(ROOT / "benchmarks"):
        fallbacks = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler)
                     and node.type is not None and "ImportError" in ast.unparse(node.type) for inner in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"kvbench[\w.]*:\w+",
                                                                                            node.value):
            names = [node.value.partition(":")[0]]
        if id(node) not in fallbacks:
            found += [f"{path.name}:{node.lineno}: {name}" for name in names
                      if name in kvbench.MOVED or name in forwarded]
    return found


@pytest.mark.parametrize("root", ["kvbench", "scripts", "benchmarks"])
def test_the_code_uses_the_new_paths(root):
    """kvbench/, scripts/ and benchmarks/ import every module where it is now (kvbench.MOVED keeps the old
    names for other people's code); kvbench/__init__.py, which names the old paths to keep them, aside."""
    files = [path for path in sorted((ROOT / root).rglob("*.py")) if path != PACKAGE / "__init__.py"]
    assert [f"{path.parent.relative_to(ROOT)}/{place}" for path in files for place in old_paths(path)] == []


def test_the_old_paths_check_sees_every_way_of_writing_one(tmp_path):
    code = tmp_path / "old.py"
    code.write_text("from kvbench import decode, config\nimport kvbench.timing as t\nfrom kvbench.serving import gate\n"
                    "from kvbench.workloads import requests, Contexts\nSTEPPER = 'kvbench.hf:steps'\n"
                    "def late():\n    from kvbench.stats import median_interval\n"
                    "from kvbench.measure import stats\nfrom kvbench.serving import trace\n")
    assert sorted(place.partition(": ")[2] for place in old_paths(code)) == [
        "kvbench.decode", "kvbench.hf", "kvbench.serving.gate", "kvbench.stats", "kvbench.timing",
        "kvbench.workloads.Contexts"]


# -- old import paths (kvbench.MOVED): the tests below write them on purpose ---------------------------------------

OLD_PATHS_PROBE = """
import sys
from kvbench.decode import run_gate
from kvbench import timing
import kvbench.serving, kvbench.trace
from kvbench.workloads import Contexts
from kvbench.serving import trace as new_trace
from kvbench.timing import per_step_seconds
from kvbench.memory import memory_profile
import kvbench.workloads.decode, kvbench.measure.timing
assert run_gate is kvbench.workloads.decode.run_gate and timing is kvbench.measure.timing
assert kvbench.serving.gate.__module__ == "kvbench.serving.replay"
assert Contexts.__module__ == "kvbench.workloads.workload"
assert kvbench.trace is new_trace is sys.modules["kvbench.serving.trace"]
assert per_step_seconds.__module__ == "kvbench.workloads.benchmark"
assert memory_profile.__module__ == "kvbench.workloads.workload"
print(sorted(name for name in sys.modules if name.startswith("kvbench")))
"""


def test_every_moved_module_imports_under_its_old_name_as_the_same_module():
    import importlib
    import sys

    import kvbench

    for old, new in kvbench.MOVED.items():
        module = importlib.import_module(old)
        assert module is importlib.import_module(new) is sys.modules[old] is sys.modules[new], old
        assert module.__name__ == module.__spec__.name == new  # its own name, not the alias
        assert getattr(kvbench, old.rpartition(".")[2]) is module  # `kvbench.decode`, read as an attribute
        place = ROOT / Path(*old.split("."))
        assert not place.with_suffix(".py").exists() and not place.is_dir(), f"{old}: a file is left at the old place"
    for old, new in kvbench.PACKAGES.items():
        assert (ROOT / Path(*old.split(".")) / "__init__.py").is_file() and new in MODULES


def test_an_old_module_keeps_its_names():
    """The old module's names: under a package that was a module, and those that moved up a layer."""
    import importlib

    import kvbench

    for package, module in kvbench.PACKAGES.items():
        package, module = importlib.import_module(package), importlib.import_module(module)
        assert package.OLD_NAMES and all(getattr(package, name) is getattr(module, name) for name in package.OLD_NAMES)
        with pytest.raises(AttributeError):
            package.no_such_name  # noqa: B018
    for old, names in kvbench.MOVED_NAMES.items():
        for name, new in names.items():
            assert getattr(importlib.import_module(old), name) is getattr(importlib.import_module(new), name)


@pytest.mark.subprocess  # a real interpreter: CI runs it (make test)
def test_old_paths_resolve_in_a_fresh_interpreter_without_loading_more_than_they_name():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", OLD_PATHS_PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(eval(done.stdout))
    assert "kvbench.serving.replay" in loaded and "kvbench.cli" not in loaded


def test_a_patch_through_an_old_path_patches_the_module_itself():
    from unittest import mock

    from kvbench.measure import timing

    with mock.patch("kvbench.timing.time_call", lambda run: -1.0):
        assert timing.time_call(None) == -1.0


# -- every tensor is made on a device someone chose --------------------------------------------------------------

CONSTRUCTORS = {"zeros", "empty", "arange", "full", "ones", "randint", "tensor", "rand", "randn", "as_tensor", "eye",
                "frombuffer", "linspace"}
DEVICE_SCANNED = ("kvbench/cache", "kvbench/attention.py", "kvbench/model.py", "kvbench/serving/scheduler.py",
                  "kvbench/serving/peer.py", "kvbench/workloads", "kvbench/models")
# (file, the call as ast.unparse writes it) -> why it takes no device
DEVICE_LESS = {
    ("kvbench/model.py", "torch.ones(width)"):
        "a parameter: built on the CPU from the seed like nn.Linear's, then moved with the module (build_model)",
    ("kvbench/cache/batch.py", "torch.frombuffer(padded, dtype=torch.long)"):
        "frombuffer reads host memory only; the table is moved to the cache's device at once (.to(self.device))",
    ("kvbench/models/corpus.py", "torch.tensor(tokens[:needed], dtype=torch.long)"):
        "a text's ids are read on the host; a run moves them to the model's device (benchmark.given_ids)",
}


def device_less_constructions(path: Path) -> list[str]:
    """Every torch.<constructor>(...) call in the file that has no device= keyword, as ast.unparse writes it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CONSTRUCTORS
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and not any(keyword.arg == "device" for keyword in node.keywords)):
            found.append(ast.unparse(node))
    return found


def test_every_tensor_the_model_caches_and_scheduler_make_names_its_device():
    """A tensor made without device= lands on the CPU whatever the model's device: the GPU run would then copy
    (or fail) at every step. Each exception names its reason in DEVICE_LESS."""
    paths = [path for scanned in DEVICE_SCANNED for path in sorted((ROOT / scanned).rglob("*.py"))
             if path.suffix == ".py"] + [ROOT / scanned for scanned in DEVICE_SCANNED if scanned.endswith(".py")]
    found = {(path.relative_to(ROOT).as_posix(), call) for path in paths for call in device_less_constructions(path)}
    assert sorted(found - set(DEVICE_LESS)) == []
    assert sorted(set(DEVICE_LESS) - found) == []  # an exception whose call is gone goes too


def test_the_device_scan_sees_a_construction_without_device(tmp_path):
    module = tmp_path / "cache.py"
    module.write_text("import torch\n\ndef f(n, d):\n    a = torch.zeros(n, device=d)\n"
                      "    return torch.arange(n) + torch.tensor([1], dtype=torch.long)\n")
    assert device_less_constructions(module) == ["torch.arange(n)", "torch.tensor([1], dtype=torch.long)"]
