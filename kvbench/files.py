"""The one way kvbench reads and writes a file.

Writing: records, environment captures, reports, plots and the README's generated blocks
all go through :func:`write_bytes_atomic`: a temporary file in the target's directory,
fsync, then a hard link (which fails if the name was taken meanwhile, so nothing is
replaced by a race) or, when replacing was asked for, a rename. Readers never see half a
file, only a regular file is ever replaced, and :func:`check_output` finds what would make
the write fail before any work is done. Every file written is listed in ``WRITTEN``, so a
message about an interrupted command can say truthfully what is on disk.

Reading: :func:`read_json` reads only regular files (a FIFO never blocks it, /dev/zero
never fills memory), at most ``MAX_READ_BYTES``, and refuses NaN, infinities and nesting
deeper than ``MAX_JSON_DEPTH``.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path

MAX_READ_BYTES = 64 << 20  # a record of 10,000 repetitions is about 2 MiB
MAX_JSON_DEPTH = 32  # records and captures nest 5 levels deep
NAME_MAX_DEFAULT = 255
PATH_MAX_DEFAULT = 4096
WRITTEN: list[Path] = []  # every file written by this process, in order


class OutputExistsError(ValueError):
    """Writing would replace an existing file, and replacing was not asked for."""


class OutputError(ValueError):
    """A path kvbench cannot or must not write: its reason names the path and the obstacle."""


class UnreadableFileError(ValueError):
    """A file kvbench will not read: missing, not a regular file, too large, or not sound JSON."""


# --- writing -------------------------------------------------------------------------------------


def check_output(path: Path | str, force: bool = False) -> None:
    """Raise OutputExistsError or OutputError unless `path` can be written (or, with `force`,
    replaced). Nothing is created: a missing parent is checked at its nearest existing ancestor."""
    path = Path(path)
    ancestor = _nearest_existing(path.parent)
    name_max, path_max = _limits(ancestor)
    if len(os.fsencode(os.path.abspath(path))) > path_max:
        raise OutputError(f"{str(path)[:40]}...: path too long: {len(os.fsencode(os.path.abspath(path)))} bytes, "
                          f"the system allows {path_max}")
    for part in path.parts:
        if len(part.encode()) > name_max:
            raise OutputError(f"{path.parent / (part[:24] + '...')}: name too long: {len(part.encode())} bytes, "
                              f"the filesystem allows {name_max}")
    kind = file_kind(path)
    if kind == "regular file":
        if not force:
            raise OutputExistsError(f"{path} already exists")
    elif kind is not None:
        raise OutputError(f"{path} already exists and is {with_article(kind)}; kvbench replaces only regular files")
    if not ancestor.is_dir():
        raise OutputError(f"{path}: {ancestor} is {with_article(file_kind(ancestor) or 'missing')}, not a directory")
    try:  # root passes every permission check, so try it for real: read-only mounts, /proc, quotas
        descriptor, trial = tempfile.mkstemp(prefix=".kvbench-trial.", dir=ancestor)
        os.close(descriptor)
        os.unlink(trial)
    except OSError as error:
        raise OutputError(f"{path}: cannot write in {ancestor}: {error.strerror or error}") from None


def write_json_atomic(data: object, path: Path | str, force: bool = False) -> Path:
    return write_bytes_atomic(path, (json_text(data) + "\n").encode(), force)


def json_text(data: object) -> str:
    """JSON indented by one space a level, except that a list of plain numbers, and an object whose values are
    plain values or such lists, stay on one line. A serving record is mostly those (every token's time stamps,
    kept raw; a request's outcome; an iteration's counts): one value a line cost each its newline and indentation,
    about as many characters as the value itself (docs/serving.md, "The record's size")."""
    lists: list[object] = []

    def flat(value: object) -> bool:
        return type(value) in (int, float, str, bool) or value is None or (
            isinstance(value, (list, tuple)) and all(type(item) in (int, float) for item in value))

    def inline(value: object) -> object:
        if isinstance(value, dict):
            if value and all(flat(item) for item in value.values()) and not any(MARK in key for key in value):
                if any(isinstance(item, str) and MARK in item for item in value.values()):
                    raise _Marked
                lists.append(value)
                return f"{MARK}{len(lists) - 1}{MARK}"
            return {key: inline(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            if value and all(type(item) in (int, float) for item in value):
                lists.append(value)
                return f"{MARK}{len(lists) - 1}{MARK}"
            return [inline(item) for item in value]
        if isinstance(value, str) and MARK in value:
            raise _Marked
        return value

    try:
        text = json.dumps(inline(data), indent=1, allow_nan=False)
    except _Marked:  # a string holding the mark itself: no line is kept short, nothing is mistaken
        return json.dumps(data, indent=1, allow_nan=False)
    escaped = re.escape(json.dumps(MARK)[1:-1])  # the mark as json.dumps writes it in a string
    return re.sub(f'"{escaped}(\\d+){escaped}"', lambda found: json.dumps(lists[int(found.group(1))], allow_nan=False),
                  text)


MARK = "\x00"  # no string kvbench writes holds a NUL


class _Marked(Exception):
    pass


def write_bytes_atomic(path: Path | str, content: bytes, force: bool = False) -> Path:
    """Temp file + fsync + link (or rename with `force`): readers never see half a file,
    and an existing file is never replaced silently. A replaced file keeps its mode."""
    path = Path(path)
    check_output(path, force)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{_short(path.name)}.", suffix=".tmp", dir=path.parent)
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror or error}") from error
    try:
        existing = _regular_mode(path)
        # mkstemp's 0600 would hide records from teammates and change a spliced README's mode.
        os.fchmod(descriptor, existing if existing is not None else 0o666 & ~current_umask())
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        _place(temporary, path, force)
    except BaseException as error:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError):  # a full disk, a quota: say which file could not be written
            raise OutputError(f"cannot write {path}: {error.strerror or error}") from error
        raise
    return path


def _place(temporary: str, path: Path, force: bool) -> None:
    """Give the finished temporary file its name: link (never over anything) or, with force,
    rename over a regular file only."""
    kind = file_kind(path) if force else None  # looked at once: what is there now, not at check_output
    if kind == "regular file":
        os.replace(temporary, path)
        WRITTEN.append(path)
        return
    if kind is not None:
        raise OutputError(f"{path} is {with_article(kind)}; kvbench replaces only regular files")
    try:
        os.link(temporary, path)  # fails if the name was taken meanwhile: no silent overwrite race
    except FileExistsError:
        raise OutputExistsError(f"{path} already exists") from None
    WRITTEN.append(path)
    os.unlink(temporary)


def file_kind(path: Path) -> str | None:
    """What is at `path` without following a final symbolic link; None when nothing is."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return "unreadable path"
    if stat.S_ISLNK(mode):
        target = file_kind(Path(os.path.realpath(path))) if os.path.exists(path) else None
        return f"symbolic link to {with_article(target)}" if target else "dangling symbolic link"
    for test, kind in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def with_article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _regular_mode(path: Path) -> int | None:
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_mode & 0o7777 if stat.S_ISREG(info.st_mode) else None


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _limits(directory: Path) -> tuple[int, int]:
    """NAME_MAX and PATH_MAX where `directory` lives."""
    limits = []
    for name, default in (("PC_NAME_MAX", NAME_MAX_DEFAULT), ("PC_PATH_MAX", PATH_MAX_DEFAULT)):
        try:
            limits.append(os.pathconf(directory, name))
        except (OSError, ValueError):
            limits.append(default)
    return limits[0], limits[1]


def _short(name: str) -> str:
    """A prefix for the temporary file that leaves room for its random part within NAME_MAX."""
    encoded = name.encode()
    return name if len(encoded) <= 200 else encoded[:200].decode(errors="ignore")


# --- reading -------------------------------------------------------------------------------------


def read_regular_file(path: Path | str, what: str = "file", limit: int = MAX_READ_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; UnreadableFileError naming the path otherwise."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat below refuses it.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnreadableFileError(f"{path}: no such file") from None
    except OSError as error:
        raise UnreadableFileError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        info = os.fstat(descriptor)
        if stat.S_ISDIR(info.st_mode):
            raise UnreadableFileError(f"{path}: is a directory, expected {with_article(what)}")
        if not stat.S_ISREG(info.st_mode):
            kind = file_kind(path) or "special file"
            raise UnreadableFileError(f"{path}: is {with_article(kind)}, not a regular file; expected {with_article(what)}")
        if info.st_size > limit:
            raise UnreadableFileError(f"{path}: {info.st_size:,} bytes, larger than the {limit:,} bytes "
                                      f"{with_article(what)} may have")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(descriptor, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # it grew while being read
            raise UnreadableFileError(f"{path}: larger than the {limit:,} bytes {with_article(what)} may have")
        return b"".join(chunks)
    except OSError as error:
        raise UnreadableFileError(f"{path}: cannot read: {error.strerror or error}") from None
    finally:
        os.close(descriptor)


def read_json(path: Path | str, what: str = "JSON file", limit: int = MAX_READ_BYTES, finite: bool = True) -> object:
    """A regular file's JSON nested at most MAX_JSON_DEPTH levels; with `finite`, finite numbers only."""
    content = read_regular_file(path, what, limit)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UnreadableFileError(f"{path}: not UTF-8 text (byte {error.start}); expected {with_article(what)}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise UnreadableFileError(f"{path}: not valid JSON (truncated or corrupt?): {error.msg} at line "
                                  f"{error.lineno} column {error.colno}") from None
    except RecursionError:
        raise UnreadableFileError(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as error:
        raise UnreadableFileError(f"{path}: {error}") from None
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise UnreadableFileError(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep")
    found = first_non_finite(data) if finite else None
    if found is not None:
        where, value = found
        name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        raise UnreadableFileError(f"{path}: {where}: non-finite number {name}; only finite numbers are expected")
    return data


def first_non_finite(data: object) -> tuple[str, float] | None:
    """The path and value of the first NaN or infinity in parsed JSON (after the depth check), or None."""
    stack = [("", data)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return where or "(top level)", item
        if isinstance(item, dict):
            stack.extend((f"{where}/{key}".lstrip("/"), value) for key, value in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{where}/{index}".lstrip("/"), value) for index, value in reversed(list(enumerate(item))))
    return None


def json_depth(data: object) -> int:
    """Nesting depth of parsed JSON, computed without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # no need to walk further than what is refused anyway
                stack.extend((child, depth + 1) for child in item)
            else:
                return depth
    return deepest
