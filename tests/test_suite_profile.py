"""scripts/suite_profile.py: the test suite's cost per worker, module and test, from what its plugin wrote."""

import importlib.util
import json
from pathlib import Path

import pytest

SPEC = importlib.util.spec_from_file_location("suite_profile", Path(__file__).resolve().parents[1] / "scripts" /
                                              "suite_profile.py")
suite_profile = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(suite_profile)


def test_a_summary_adds_each_workers_tests_by_module_and_ranks_the_costliest(tmp_path, capsys):
    rows = {
        "gw0": [{"test": "<collection>", "cpu": 3.0, "children_cpu": 0.0, "wall": 3.0, "started": 0.0, "gc": 0.5},
                {"test": "tests/test_a.py::one", "cpu": 1.0, "children_cpu": 2.0, "wall": 3.5, "started": 10.0,
                 "gc": 0.25},
                {"test": "tests/test_b.py::two", "cpu": 0.5, "children_cpu": 0.0, "wall": 0.5, "started": 14.0,
                 "gc": 0.0}],
        "gw1": [{"test": "tests/test_a.py::three", "cpu": 4.0, "children_cpu": 0.0, "wall": 4.0, "started": 11.0,
                 "gc": 1.0}],
    }
    for worker, written in rows.items():
        (tmp_path / f"{worker}.json").write_text(json.dumps(written))
    assert suite_profile.main([str(tmp_path), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "gw0: 2 tests, 4.5 s from the first to the end of the last, 3.5 s of CPU in tests, " \
                       "0.8 s in the collector"  # the collection's 0.5 s of it too
    assert lines[1] == "gw1: 1 tests, 4.0 s from the first to the end of the last, 4.0 s of CPU in tests, " \
                       "1.0 s in the collector"
    assert lines[3].split() == ["7.0", "s", "(", "2.0", "s)", "2", "tests", "tests/test_a.py"]
    assert lines[4].split()[-1] == "tests/test_b.py"
    assert [line.split()[-1] for line in lines[6:]] == ["tests/test_a.py::three", "tests/test_a.py::one"]


def test_a_folder_without_a_profile_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        suite_profile.main([str(tmp_path)])
    assert ended.value.code == 2
    assert capsys.readouterr().err == f"suite_profile: no profile in {tmp_path}: run pytest with -p suite_profile " \
                                      "first\n"
