"""kvbench records in the formats continuous-benchmarking engines read (docs/export.md).

`export_document(views, format_name, options)` returns the document one file holds: `common`
turns each record into cells once; one module per format lays them out. ValueError (one line,
naming what is wrong) when the records cannot go into one document of that format.
"""

from __future__ import annotations

import json

from kvbench.export import bmf, conbench, github_action, pytest_benchmark
from kvbench.export.common import sources_of
from kvbench.record import RecordView

FORMATS = {"bmf": bmf.document, "conbench": conbench.document, "github-action-benchmark": github_action.document,
           "github-action-benchmark-bigger-is-better": github_action.bigger_document,
           "pytest-benchmark": pytest_benchmark.document}

__all__ = ["FORMATS", "export_bytes", "export_document"]


def export_document(views: list[RecordView], format_name: str, options: dict | None = None) -> object:
    if format_name not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {format_name!r}")
    if not views:
        raise ValueError("no record to export")
    sources = sources_of(views)
    if not any(source.cells for source in sources):
        raise ValueError(f"{', '.join(source.path for source in sources)}: no timed cell to export")
    return FORMATS[format_name](sources, options or {})


def export_bytes(views: list[RecordView], format_name: str, options: dict | None = None) -> bytes:
    return (json.dumps(export_document(views, format_name, options), indent=1, allow_nan=False) + "\n").encode()
