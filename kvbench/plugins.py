"""Cache kinds of your own: a Python file that registers a mode, loaded by path.

The file registers into the mode registry (kvbench.modes): a kvbench.modes.ModeSpec of its own
(`modes.register`), or a Cache subclass through kvbench.cache.register_kind, which builds the spec
from the class (docs/extending.md).

`kvbench run --plugin my_cache.py --modes full,static,mine` times a kind kvbench does not
ship, through the same gate, protocol and record. The record names each plugin file with
its SHA-256 and the kinds it registered, so a reader knows exactly what ran and a record
of a plugin kind stays readable where the plugin is not installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from kvbench import modes
from kvbench.files import read_regular_file


def load_plugin(path: Path | str) -> dict:
    """Run the file as a module; return {"path", "sha256", "kinds"} for the record."""
    path = Path(path)
    content = read_regular_file(path, "Python file")
    before = set(modes.names())
    name = f"kvbench_plugin_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python file kvbench can load as a plugin")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # noqa: BLE001 - whatever the plugin raises, the user gets one line
        raise ValueError(f"{path}: the plugin raised {type(error).__name__}: {error}") from None
    kinds = sorted(set(modes.names()) - before)
    if not kinds:
        raise ValueError(f"{path}: the plugin registered no cache kind (expected a call to kvbench.cache.register_kind "
                         "or kvbench.modes.register)")
    return {"path": str(path), "sha256": hashlib.sha256(content).hexdigest(), "kinds": kinds}
