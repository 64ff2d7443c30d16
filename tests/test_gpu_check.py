"""scripts/gpu_check.sh's plumbing on a CPU (--dry-run): every stage under its timeout, its log and record in one
folder, the stages' statuses and where the records went on its last lines. The GPU run itself is docs/gpu.md's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvbench.record import load_record

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_the_gpu_check_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True).returncode == 0


@pytest.mark.subprocess
def test_a_dry_run_writes_every_asked_stages_record_to_one_folder_and_says_where(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "KVBENCH_GPU_CHECK_OUT": str(tmp_path / "gpu"),
           "KVBENCH_GPU_CHECK_STAGES": "tests serving", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert lines[-2:] == ["gpu_check: stages: tests=0 serving=0", f"gpu_check: records: {tmp_path / 'gpu'}"]
    assert "gpu_check: contexts: not asked for" in lines and "gpu_check: compiled: not asked for" in lines
    record = load_record(tmp_path / "gpu" / "serving.json")
    assert record["protocol"]["device"] == "cpu" and record["run"]["preset"] == "llama-tiny"
    assert "7 skipped" in (tmp_path / "gpu" / "tests.log").read_text()  # no CUDA here: every gpu test skips
    assert sorted(path.name for path in (tmp_path / "gpu").iterdir()) == ["serving.json", "serving.log", "tests.log",
                                                                          "torch.txt"]
