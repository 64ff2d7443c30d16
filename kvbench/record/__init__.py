"""The run record: one versioned JSON file, validated on write and on read.

Top-level keys: schema, status, created_utc, command, config, run, protocol,
environment, checks, repetitions, sampling, summary, memory (and per_step with a profile,
limits, machine_probe, a real model's sections). Everything derived (summary) is
recomputed from the raw repetitions when a record is loaded, so a record whose numbers
disagree with its own samples is rejected rather than believed. An older record
(schema 1 or 2) is upgraded on load, then checked like a new one. Modules, bottom up:
``entries`` (CellKey, Workload, Repetition), ``summary`` (what a record derives),
``meaning`` and ``upgrade`` (older records to the current shape), ``schema`` (what a
sound record is), ``store`` (build, write, load), ``view`` (:class:`RecordView`, which
every reader goes through). docs/record.md describes the format.
"""

from kvbench.record.entries import CellKey, Repetition, Workload
from kvbench.record.schema import (
    MODE_NAME,
    RECORD_SCHEMA,
    SCHEMA,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    STATUSES,
    RecordError,
    validate_record,
)
from kvbench.record.store import (
    DEFAULT_RECORDS_DIR,
    RecordExistsError,
    build_record,
    default_record_path,
    load_record,
    record_from_run,
    utc_now,
    write_record,
)
from kvbench.record.summary import by_cell, cell_statistics, samples_by_cell, summarize
from kvbench.record.upgrade import upgrade
from kvbench.record.view import RecordView

__all__ = ["DEFAULT_RECORDS_DIR", "MODE_NAME", "RECORD_SCHEMA", "SCHEMA", "SCHEMA_NAME", "SCHEMA_VERSION", "STATUSES",
           "CellKey", "RecordError", "RecordExistsError", "RecordView", "Repetition", "Workload", "build_record",
           "by_cell", "cell_statistics", "default_record_path", "load_record", "record_from_run", "samples_by_cell",
           "summarize", "upgrade", "utc_now", "validate_record", "write_record"]
