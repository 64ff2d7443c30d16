"""Does kvbench compare tell a slower machine from slower code? Two pairs of real runs, compared.

- machine: run A on the machine as it is, then start an antagonist on the run's CPU
  (scripts/antagonist.py busy, 50% duty) and run B beside it: the same code on a slower
  machine. `kvbench compare A B` must say the machine was slower, that every cell moved with
  it, and call nothing slower.
- code: run C as it is, then D with tests/plugins/slow_full.py, which slows only the full-prefix
  path (a spin per full-prefix call): the machine unchanged, the shared path slower. compare
  must call full slower and say the probe did not move.

    python scripts/machine_probe_evidence.py --out results/machine-probe

Records and the two comparisons (markdown) go to --out; exit status 1 when either pair is judged
otherwise than above.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from antagonist import contended

from kvbench.files import write_bytes_atomic
from kvbench.record import RecordView
from kvbench.report.comparison import markdown
from kvbench.report.comparison.compare import SLOWER, compare_records

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--lengths", "64,256", "--modes", "full,concat,static", "--cpu", "0", "--no-progress"]


def run(path: Path, *extra: str) -> RecordView:
    if not path.exists():
        done = subprocess.run([sys.executable, "-m", "kvbench", "run", *GRID, *extra, "--output", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"kvbench run exited {done.returncode}: {done.stderr.strip()}")
    return RecordView.load(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/machine-probe"))
    args = parser.parse_args(argv)
    a = run(args.out / "machine-a.json")
    with contended("busy-50"):
        b = run(args.out / "machine-b.json")
    c = run(args.out / "code-c.json")
    d = run(args.out / "code-d.json", "--plugin", str(ROOT / "tests" / "plugins" / "slow_full.py"))
    machine, code = compare_records(a, b), compare_records(c, d)
    for name, comparison in (("machine", machine), ("code", code)):
        write_bytes_atomic(args.out / f"compare-{name}.md", markdown.render_comparison(comparison).encode(), force=True)
    machine_ok = (machine.machine is not None and machine.machine.moved and not machine.regressions
                  and any("every cell there moved with the machine" in note for note in machine.notes))
    code_ok = (code.machine is not None and not code.machine.moved
               and all(cell.verdict == SLOWER for cell in code.cells if cell.mode == "full")
               and any("while the machine probe did not" in note for note in code.notes))
    print(f"machine pair: {'as expected' if machine_ok else 'NOT as expected'}; "
          f"code pair: {'as expected' if code_ok else 'NOT as expected'} (comparisons in {args.out})")
    return 0 if machine_ok and code_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
