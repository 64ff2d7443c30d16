"""Cold start: a fresh interpreter importing kvbench's decode and timing path, torch included.

Every benchmark process, and every `kvbench run`, pays this before its first loop.
"""

import os

import kvbench

from . import common


class TimeImport:
    """Seconds to import kvbench's decode and timing modules in a new process."""

    version = "kvbench-import-1"
    setup_cache = staticmethod(common.prepare)
    number = 1  # one import per fresh process
    repeat = (3, 7, 60.0)
    timeout = 600

    def timeraw_import_kvbench(self, gate):
        # The child imports the kvbench this process imported, wherever asv found it.
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(kvbench.__file__)))
        setup = f"import sys; sys.path.insert(0, {package_root!r})"
        return IMPORT, setup


# kvbench's packages by concern, or the flat modules of a commit before them: the same decode and timing path
IMPORT = """
try:
    import kvbench.measure.timing, kvbench.workloads.decode
except ImportError:
    import kvbench.workloads.decode, kvbench.measure.timing
"""
