"""The one way kvbench writes a file: atomically, and never over something it was not asked to replace.

Records, environment captures, reports, plots and the README's generated blocks all go
through :func:`write_bytes_atomic`: a temporary file in the target's directory, fsync,
then a hard link (which fails if the name was taken meanwhile, so nothing is replaced by
a race) or, when replacing was asked for, a rename. Readers never see half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


class OutputExistsError(ValueError):
    """Writing would replace an existing file, and replacing was not asked for."""


def write_json_atomic(data: object, path: Path | str, force: bool = False) -> Path:
    return write_bytes_atomic(path, (json.dumps(data, indent=1, allow_nan=False) + "\n").encode(), force)


def write_bytes_atomic(path: Path | str, content: bytes, force: bool = False) -> Path:
    """Temp file + fsync + link (or rename with `force`): readers never see half a file,
    and an existing file is never replaced silently. A replaced file keeps its mode."""
    path = Path(path)
    if path.exists() and not force:
        raise OutputExistsError(f"{path} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp's 0600 would hide records from teammates and change a spliced README's mode.
        os.fchmod(descriptor, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~current_umask())
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        if force:
            os.replace(temporary, path)
        else:
            # link() fails if the name was taken meanwhile: no silent overwrite race.
            try:
                os.link(temporary, path)
            except FileExistsError:
                raise OutputExistsError(f"{path} already exists") from None
            os.unlink(temporary)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
