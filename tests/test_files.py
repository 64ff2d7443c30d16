"""kvbench.files: the one atomic writer: never half a file, never an unasked-for replacement."""

import json
import os

import pytest

import kvbench.files as files
from kvbench.files import OutputExistsError, write_bytes_atomic, write_json_atomic


def test_writes_creating_parents_and_leaves_no_temporary(tmp_path):
    path = write_bytes_atomic(tmp_path / "a" / "b.txt", b"hello")
    assert path.read_bytes() == b"hello"
    assert os.listdir(path.parent) == ["b.txt"]


def test_never_replaces_without_force(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("precious")
    with pytest.raises(OutputExistsError, match=f"^{path} already exists$"):
        write_json_atomic({"a": 1}, path)
    assert path.read_text() == "precious" and os.listdir(tmp_path) == ["x.json"]
    assert issubclass(OutputExistsError, ValueError)


def test_force_replaces_and_keeps_the_files_mode(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("old")
    path.chmod(0o640)
    write_bytes_atomic(path, b"new", force=True)
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o640
    assert os.listdir(tmp_path) == ["README.md"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "fsync", fail)
    with pytest.raises(files.OutputError, match=r"cannot write .*run.json: disk full"):
        write_json_atomic({"a": 1}, tmp_path / "run.json")
    assert os.listdir(tmp_path) == []


def test_json_refuses_non_finite_numbers(tmp_path):
    with pytest.raises(ValueError, match="Out of range float values"):
        write_json_atomic({"a": float("nan")}, tmp_path / "a.json")
    assert os.listdir(tmp_path) == []


def test_written_files_follow_the_umask_not_mkstemps_0600(tmp_path):
    old = os.umask(0o022)
    try:
        path = write_json_atomic({"a": 1}, tmp_path / "a.json")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_json_text_keeps_number_lists_and_flat_objects_on_one_line_and_reads_back_the_same():
    data = {"stamps": [0.015356434, 2, 3.5], "request": {"id": 3, "times": [1.0, 2.0], "cancelled": False, "note": None},
            "nested": {"inner": {"a": 1}}, "mixed": [True, 1], "lists": [[1, 2], []], "pair": (1, 2)}
    text = files.json_text(data)
    assert json.loads(text) == {**data, "pair": [1, 2]}
    assert '"stamps": [0.015356434, 2, 3.5]' in text  # one line: no newline and indentation per number
    assert '"request": {"id": 3, "times": [1.0, 2.0], "cancelled": false, "note": null}' in text
    assert '"nested": {\n  "inner": {"a": 1}\n }' in text and '"mixed": [\n  true,\n  1\n ]' in text
    assert text == files.json_text(json.loads(text))  # what is read back is written the same


def test_json_text_of_a_string_holding_its_mark_is_plain_indented_json():
    data = {"text": f"{files.MARK}0{files.MARK}", "stamps": [1, 2]}
    assert json.loads(files.json_text(data)) == data
    assert files.json_text(data) == json.dumps(data, indent=1)
