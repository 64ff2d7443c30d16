"""kvbench: what a KV cache saves, measured against full-prefix decoding, with an equivalence gate.

Old import paths keep working. Until the packages by concern (docs/architecture.md) kvbench's modules
sat flat in this package; `MOVED` names each one that moved and where it went. A finder on
`sys.meta_path` imports an old name as the module it became, the same object under both names
(`kvbench.decode is kvbench.workloads.decode`), so old scripts, notebooks and tests, `mock.patch` strings
and asv suites run against today's commit keep working; no file is left at the old place. Two old
modules became packages (`PACKAGES`): their `__getattr__` forwards the old module's names, lazily
(`from kvbench.workloads import Contexts`). `MOVED_NAMES` holds the few functions that moved up a layer,
out of their module, and are still found under its old name (`from kvbench.timing import per_step_seconds`).
kvbench's own code, scripts and benchmarks use the new paths (tests/test_structure.py checks it).
"""

import importlib
import sys
from importlib.machinery import ModuleSpec

__version__ = "0.1.0"

MOVED = {  # old module name -> the module it became
    # measurement: the protocol, one timed call, rounds, telemetry, statistics, the environment
    "kvbench.timing": "kvbench.measure.timing",
    "kvbench.telemetry": "kvbench.measure.telemetry",
    "kvbench.sampling": "kvbench.measure.sampling",
    "kvbench.estimation": "kvbench.measure.estimation",
    "kvbench.stats": "kvbench.measure.stats",
    "kvbench.latency": "kvbench.measure.latency",
    "kvbench.machine": "kvbench.measure.machine",
    "kvbench.memory": "kvbench.measure.memory",
    "kvbench.capture": "kvbench.measure.capture",
    "kvbench.signals": "kvbench.measure.signals",
    # models from outside kvbench
    "kvbench.hf": "kvbench.models.hf",
    "kvbench.gguf": "kvbench.models.gguf",
    "kvbench.gguf_writer": "kvbench.models.gguf_writer",
    "kvbench.corpus": "kvbench.models.corpus",
    "kvbench.compiled": "kvbench.models.compiled",
    # workloads
    "kvbench.decode": "kvbench.workloads.decode",
    "kvbench.requests": "kvbench.workloads.requests",
    "kvbench.benchmark": "kvbench.workloads.benchmark",
    "kvbench.quality": "kvbench.workloads.quality",
    # serving
    "kvbench.trace": "kvbench.serving.trace",
    "kvbench.admission": "kvbench.serving.admission",
    "kvbench.scheduler": "kvbench.serving.scheduler",
    "kvbench.serving_figures": "kvbench.serving.figures",
    "kvbench.peer": "kvbench.serving.peer",
}

PACKAGES = {  # an old module that is a package now -> the module that holds its old contents
    "kvbench.workloads": "kvbench.workloads.workload",
    "kvbench.serving": "kvbench.serving.replay",
}

MOVED_NAMES = {  # old module name -> {a name that moved up a layer, out of it: the module that holds it now}
    "kvbench.timing": {"per_step_seconds": "kvbench.workloads.benchmark"},  # a loop's per-step profile
    "kvbench.memory": {"memory_profile": "kvbench.workloads.workload"},  # a loop's memory entry
}


class OldModuleNames:
    """The meta-path finder and loader of `MOVED`'s old names.

    The loader runs the new module's import and puts it in `sys.modules` under the old name too: the
    import system then returns what `sys.modules` holds (CPython's `_load_unlocked`), so both names
    are one module, whose `__name__` and `__spec__` stay its own."""

    def find_spec(self, name, path=None, target=None):
        return ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec):
        return None  # a placeholder module, replaced in exec_module

    def exec_module(self, module):
        old = module.__name__
        new = importlib.import_module(MOVED[old])
        if old in MOVED_NAMES and "__getattr__" not in vars(new):
            new.__getattr__ = moved_name_getter(old)
        sys.modules[old] = new


def moved_name_getter(old: str):
    """A module `__getattr__` that finds the names that left `old` (MOVED_NAMES) where they went."""

    def getter(name: str):
        if name in MOVED_NAMES[old]:
            return getattr(importlib.import_module(MOVED_NAMES[old][name]), name)
        raise AttributeError(f"module {MOVED[old]!r} has no attribute {name!r}")

    return getter


def __getattr__(name: str):
    """`kvbench.decode` read as an attribute, the old way, imports the module it became."""
    if f"{__name__}.{name}" in MOVED:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# First on the path: an old name is never a file now, and no other finder (an editable install of an older
# checkout, say) may answer it with another module. Once, however often kvbench is reloaded.
if not any(type(finder).__name__ == OldModuleNames.__name__ for finder in sys.meta_path):
    sys.meta_path.insert(0, OldModuleNames())
