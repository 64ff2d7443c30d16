"""Work that every reader of one record repeats, done once: for the hostile-record fuzzers.

A fuzzer (tests/test_record_hostile.py, tests/test_serving_hostile.py) runs every command that reads a record --
show, report in three layouts, compare, export in each format: a dozen commands -- on each mutated record. Each
command loads the same file again (read, check every number is finite, check the shape, upgrade: most of an
example's CPU, and on a refused record jsonschema's search for the best error), and the HTML report draws its plots
from what the record holds, which most mutations (an environment field, a command word) leave as they were.

`shared_reads()` patches both, for the duration of a `with`: a load is kept under the path as given and the file's
bytes (a refusal too: raised again, the same one line), and each plot under everything it can be drawn from. Each
command still runs whole on what it loaded; every distinct file is loaded, and every distinct plot drawn, once.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path

import pytest

from kvbench.record import RecordError

SHARED_BYTES = 64 * 2**20  # a larger file (or no regular file) is loaded afresh: the reader's own bounds are tested


@contextlib.contextmanager
def shared_reads():
    from kvbench.record import view
    from kvbench.report.record import plots, serving

    loads, panels, memory = {}, {}, {}
    load_record, render_panels, memory_plot = view.load_record, plots.render_panels, serving.memory_plot

    def load_once(path):
        file = Path(path)
        if not file.is_file() or file.stat().st_size > SHARED_BYTES:
            return load_record(path)
        key = (str(path), file.read_bytes())
        if key not in loads:
            try:
                loads[key] = ("loaded", load_record(path))
            except RecordError as error:
                loads[key] = ("refused", str(error))
        outcome, kept = loads[key]
        if outcome == "refused":
            raise RecordError(kept)
        return copy.deepcopy(kept)  # a fresh copy: a reader may change what it was given

    def panels_once(report, suffix=".png"):
        from dataclasses import replace

        # what no panel reads (kvbench.report.record.plots draws from the rows, fits, profile, limits, ...): the
        # file's name, its creation, command, environment and notes, which mutations change most
        key = (repr(replace(report, source="", created_utc="", command=[], environment={}, notes=[])), suffix)
        if key not in panels:
            panels[key] = render_panels(report, suffix)
        return dict(panels[key])

    def memory_once(record_view, suffix=".png"):
        key = (json.dumps([list(record_view.modes), record_view.serving.replays, record_view.serving.budget],
                          sort_keys=True, default=repr), suffix)
        if key not in memory:
            memory[key] = memory_plot(record_view, suffix)
        return memory[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(view, "load_record", load_once)
        patch.setattr(plots, "render_panels", panels_once)
        patch.setattr(serving, "memory_plot", memory_once)
        yield
