"""The small asv result set behind docs/history.md: a real asv run of two commits on two machine names.

A scratch clone of this repository (so asv sees real commits) is benchmarked with the existing
environment (this interpreter; kvbench imported from the clone), each of its last two commits
checked out in turn and filed under its hash with `--set-commit-hash`, on machines `history-a` and `history-b` registered by `kvbench
asv-machine` in a scratch HOME. The second commit on `history-b` runs with `--cpu-affinity 0`:
a real environment difference asv applies and the capture records (system.cpu_affinity), which
the page marks. Only a few cells run (`--bench`, length 64), with `--record-samples` so the page
can build kvbench's intervals from asv's samples. Results and captures are copied to OUT/asv and
OUT/captures (beside each other, as asv and kvbench lay them out); nothing else is touched.

    python scripts/asv_history.py --out results/history
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MACHINES = ("history-a", "history-b")
BENCHMARKS = (r"decode.TimeDecode.time_decode\((?:'seed', )?'(full|concat|static)', 64\)",  # with or without
              r"speedup.TrackSpeedup.track_speedup\((?:'seed', )?'static', 64\)")  # the model parameter
PINNED = {("history-b", 1): ["--cpu-affinity", "0"]}  # (machine, commit index) -> extra asv options


def run(command: list[str], cwd: Path, env: dict) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=cwd, env=env, check=True, timeout=1800)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for asv/ and captures/ (replaced)")
    args = parser.parse_args()
    asv = str(Path(sys.executable).with_name("asv"))
    with tempfile.TemporaryDirectory(prefix="kvbench-history-") as scratch:
        repo, home = Path(scratch) / "repo", Path(scratch) / "home"
        home.mkdir()
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        git(repo, "checkout", "-q", "-B", "main")  # asv.conf.json's branch, whatever branch this checkout is on
        commits = [git(repo, "rev-parse", "HEAD~1"), git(repo, "rev-parse", "HEAD")]
        env = dict(os.environ, HOME=str(home), KVBENCH_ASV_LENGTHS="64", PYTHONPATH=str(repo),
                   ASV_PYTHONPATH=str(repo))
        for machine in MACHINES:
            run([sys.executable, "-m", "kvbench", "asv-machine", "--name", machine], repo, env)
        for index, commit in enumerate(commits):
            git(repo, "checkout", "-q", commit)  # each commit's own kvbench and suite, filed under its hash
            for machine in MACHINES:
                selection = [option for pattern in BENCHMARKS for option in ("--bench", pattern)]
                run([asv, "run", "-E", f"existing:{sys.executable}", "--set-commit-hash", commit, "--machine",
                     machine, "--record-samples", *selection, *PINNED.get((machine, index), [])], repo, env)
        git(repo, "checkout", "-q", "main")
        for name in ("asv", "captures"):
            target = args.out / name
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            for machine in MACHINES:
                shutil.copytree(repo / "results" / name / machine, target / machine)
        shutil.copy2(repo / "results" / "asv" / "benchmarks.json", args.out / "asv" / "benchmarks.json")
    print(f"asv results and captures of {', '.join(MACHINES)} at {', '.join(c[:8] for c in commits)} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
