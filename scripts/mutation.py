"""Mutation testing of kvbench's core modules: does each module's focused test file notice a wrong implementation?

Each mutant is one :mod:`ast` change (a comparison, an operator, a number +-1, a dropped raise or call, an early
return) in a throwaway copy of the project, judged by its module's focused tests; the sample is seeded per module,
the mutants of scripts/mutation_equivalent.toml are left out. docs/mutation.md: the method and the scores.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENT_FILE = ROOT / "scripts" / "mutation_equivalent.toml"
GATE = frozenset({"compare_logits", "compare_drift", "check_equivalence", "judge_logits", "run_gate", "top1_agrees",
                  "first_step", "tolerances"})
PYTEST = ("-x", "-q", "-p", "no:cacheprovider")  # pytest -x -q -p no:cacheprovider <tests>
CONTIGUOUS_CASES = "(concat or static) and not (mqa or layers3 or qwen or gemma or random_chunk)"  # 4 of 9 models
QUALITY_CASES = "not (report or marked or plot or other_work or real_model_page)"
COPIED = ("kvbench", "tests", "pyproject.toml")  # all the focused tests read: no results, no docs


@dataclass(frozen=True)
class Target:
    """A module (or the part of one whose top-level definitions pass `within`) and the tests that are its own."""

    path: str
    tests: tuple[str, ...]
    only: frozenset[str] | None = None  # top-level names mutated; None: all
    skip: frozenset[str] = frozenset()  # top-level names never mutated
    select: str | None = None  # a pytest -k expression: the tests of the module's own kinds in a shared file

    def pytest_arguments(self) -> list[str]:
        return [*PYTEST, *self.tests, *(("-k", self.select) if self.select else ())]

    def within(self, name: str | None) -> bool:
        return name not in self.skip and (self.only is None or name in self.only)


TARGETS = {
    "stats": Target("kvbench/measure/stats.py", ("tests/test_stats.py",)),
    "attention": Target("kvbench/attention.py", ("tests/test_attention.py",)),
    # test_cache.py runs every kind on nine models (minutes): a kind's module is judged by its own kinds' cases
    "contiguous": Target("kvbench/cache/contiguous.py", ("tests/test_cache.py",), select=CONTIGUOUS_CASES),
    "paged": Target("kvbench/cache/paged.py", ("tests/test_paged.py",)),
    # test_decode.py's loops over every kind and family take minutes; check_equivalence drives every mode too
    "gate": Target("kvbench/workloads/decode.py", ("tests/test_decode.py",), only=GATE,
                   select="not follow_full_prefix and not footprint"),
    "decode": Target("kvbench/workloads/decode.py", ("tests/test_decode.py",), skip=GATE,
                     select="not follow_full_prefix"),
    "sampling": Target("kvbench/measure/sampling.py", ("tests/test_sampling.py",)),
    # the scheduler has no test file: test_serving.py replays traces through it, test_admission.py watches its ledgers
    # (the CLI run, 5 s a mutant, checks nothing more of it); test_trace.py checks admission's reservations too
    "scheduler": Target("kvbench/serving/scheduler.py", ("tests/test_serving.py", "tests/test_admission.py"),
                        select="not end_to_end and not summary_reads_ratios"),  # that one reads results/, not copied
    "admission": Target("kvbench/serving/admission.py", ("tests/test_admission.py", "tests/test_trace.py")),
    **{name: Target(path, (f"tests/test_{name}.py",)) for name, path in (("batch", "kvbench/cache/batch.py"),
        ("trace", "kvbench/serving/trace.py"), ("serving_figures", "kvbench/serving/figures.py"),
        ("latency", "kvbench/measure/latency.py"))},  # each judged by its mirror test file
    # test_quality.py's report, plot and docs tests judge kvbench/report/ and scripts/ (results/ is not copied)
    "quality": Target("kvbench/workloads/quality.py", ("tests/test_quality.py",), select=QUALITY_CASES),
}

COMPARISONS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
               ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
ARITHMETIC = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
              ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
BOOLEAN = {ast.And: ast.Or, ast.Or: ast.And}


@dataclass(frozen=True)
class Mutant:
    module: str
    path: str
    line: int
    column: int
    description: str
    node_index: int  # position in ast.walk order of the original tree
    operator: str  # compare, arithmetic, boolean, not, constant+1, constant-1, drop-raise, drop-call, early-return

    def where(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


def short(node: ast.AST, limit: int = 70) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unmutated(tree: ast.Module) -> set[int]:
    """ids of nodes never mutated: annotations (never evaluated under `from __future__ import annotations`),
    docstrings, f-strings (the wording of messages) and imports."""
    frozen: list[ast.AST] = []
    for node in ast.walk(tree):
        frozen += [part for part in (getattr(node, "annotation", None), getattr(node, "returns", None)) if part]
        if isinstance(node, ast.JoinedStr | ast.Import | ast.ImportFrom):
            frozen.append(node)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef) and node.body and is_docstring(node.body[0]):
            frozen.append(node.body[0])
    return {id(inner) for node in frozen for inner in ast.walk(node)}


def is_docstring(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) and isinstance(
        statement.value.value, str)


def owners(tree: ast.Module) -> dict[int, str | None]:
    """id(node) -> the name of the top-level definition it belongs to (None for module-level statements)."""
    owner: dict[int, str | None] = {}
    for statement in tree.body:
        name = getattr(statement, "name", None)
        for node in ast.walk(statement):
            owner[id(node)] = name
    return owner


def mutations_of(node: ast.AST) -> list[tuple[str, str]]:
    """(operator, description) of every mutant one node offers."""
    found = []
    if isinstance(node, ast.Compare):
        for position, op in enumerate(node.ops):
            if type(op) in COMPARISONS:
                found.append((f"compare{position}", f"`{short(node)}` -> `{short(apply(node, f'compare{position}'))}`"))
    elif isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in ARITHMETIC:
        found.append(("arithmetic", f"`{short(node)}` -> `{short(apply(node, 'arithmetic'))}`"))
    elif isinstance(node, ast.BoolOp):
        found.append(("boolean", f"`{short(node)}` -> `{short(apply(node, 'boolean'))}`"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not | ast.USub):
        found.append(("unary", f"`{short(node)}` -> `{short(node.operand)}`"))
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        for step in (1, -1):
            found.append((f"constant{step:+d}", f"`{node.value!r}` -> `{node.value + step!r}`"))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        found.append(("bool", f"`{node.value}` -> `{not node.value}`"))
    elif isinstance(node, ast.Raise):
        found.append(("drop-raise", f"drop `{short(node)}`"))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        found.append(("drop-call", f"drop `{short(node)}`"))
    elif isinstance(node, ast.FunctionDef):
        found.append(("early-return", f"`return` at the start of `{node.name}`"))
    return found


def apply(node: ast.AST, operator: str) -> ast.AST:
    """The mutated copy of one node (a Pass for a dropped statement)."""
    mutated = copy.deepcopy(node)
    if operator.startswith("compare"):
        position = int(operator.removeprefix("compare"))
        mutated.ops[position] = COMPARISONS[type(node.ops[position])]()
    elif operator == "arithmetic":
        mutated.op = ARITHMETIC[type(node.op)]()
    elif operator == "boolean":
        mutated.op = BOOLEAN[type(node.op)]()
    elif operator == "unary":
        return mutated.operand
    elif operator.startswith("constant"):
        mutated.value = node.value + int(operator.removeprefix("constant"))
    elif operator == "bool":
        mutated.value = not node.value
    elif operator in ("drop-raise", "drop-call"):
        return ast.copy_location(ast.Pass(), node)
    elif operator == "early-return":
        start = 1 if mutated.body and is_docstring(mutated.body[0]) else 0
        mutated.body.insert(start, ast.copy_location(ast.Return(value=None), mutated.body[start]))
    return mutated


def enumerate_mutants(module: str, target: Target) -> list[Mutant]:
    tree = ast.parse((ROOT / target.path).read_text())
    frozen, owner = unmutated(tree), owners(tree)
    mutants = []
    for index, node in enumerate(ast.walk(tree)):
        if id(node) in frozen or not hasattr(node, "lineno") or not target.within(owner.get(id(node))):
            continue
        for operator, description in mutations_of(node):
            mutants.append(Mutant(module, target.path, node.lineno, node.col_offset, description, index, operator))
    return mutants


def mutated_source(mutant: Mutant) -> str:
    tree = ast.parse((ROOT / mutant.path).read_text())
    nodes = list(ast.walk(tree))
    original = nodes[mutant.node_index]
    replacement = apply(original, mutant.operator)
    for parent in nodes:  # swap the node in its parent, wherever it sits
        for name, value in ast.iter_fields(parent):
            if value is original:
                setattr(parent, name, replacement)
                return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
            if isinstance(value, list) and any(item is original for item in value):
                value[[item is original for item in value].index(True)] = replacement
                return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
    raise ValueError(f"mutant {mutant.where()} {mutant.description}: node not found")


def sample_mutants(module: str, target: Target, size: int, seed: int) -> list[Mutant]:
    every = enumerate_mutants(module, target)
    chosen = random.Random(f"{seed}:{module}").sample(every, min(size, len(every)))
    return sorted(chosen, key=lambda m: (m.line, m.node_index, m.operator))


def load_equivalent(path: Path = EQUIVALENT_FILE) -> dict[tuple[str, str], str]:
    """(file:line:column, mutation) -> why the mutant cannot change behaviour."""
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text()).get("equivalent", [])
    for entry in entries:
        if not entry.get("why", "").strip():
            raise ValueError(f"{path}: equivalent mutant {entry.get('at')} has no reason")
    return {(entry["at"], entry["mutation"]): entry["why"] for entry in entries}


SERVER = r"""
import json, os, signal, sys, time
import numpy, scipy.stats, torch, hypothesis, pytest  # the seconds of imports every mutant would repeat
for line in sys.stdin:
    timeout, arguments = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the mutant's own process: it imports kvbench afresh, from this copy
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os._exit(int(pytest.main(arguments)))
    deadline, status = time.monotonic() + float(timeout), None
    while status is None:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = "passed" if os.waitstatus_to_exitcode(code) == 0 else "failed"
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "timeout"
        else:
            time.sleep(0.02)
    print(status, flush=True)
"""


class Workspace:
    """A throwaway copy of the project that mutants are written into; the working tree is never touched.

    Its server has imported torch, numpy, scipy and pytest once, and forks a process per test run, which
    imports kvbench from this copy: each mutant runs in a process of its own without paying for the imports.
    """

    def __init__(self, python: str) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="kvbench-mutation-"))
        for name in COPIED:
            source = ROOT / name
            if source.is_dir():
                shutil.copytree(source, self.directory / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, self.directory / name)
        # The editable install points at the working tree: PYTHONPATH puts this copy's kvbench first.
        environment = {**os.environ, "PYTHONPATH": str(self.directory), "PYTHONDONTWRITEBYTECODE": "1"}
        self.server = subprocess.Popen([python, "-c", SERVER], cwd=self.directory, env=environment, text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    def run_tests(self, arguments: list[str], timeout: float) -> tuple[str, float]:
        """'passed', 'failed' or 'timeout' of `pytest arguments`, and the seconds taken."""
        started = time.monotonic()
        self.server.stdin.write(json.dumps([timeout, arguments]) + "\n")
        self.server.stdin.flush()
        outcome = self.server.stdout.readline().strip()
        if outcome not in ("passed", "failed", "timeout"):
            raise RuntimeError(f"the test server in {self.directory} stopped (exit {self.server.poll()})")
        return outcome, time.monotonic() - started

    def write(self, path: str, text: str) -> None:
        (self.directory / path).write_text(text)

    def restore(self, path: str) -> None:
        shutil.copy2(ROOT / path, self.directory / path)

    def remove(self) -> None:
        stop(self.server)
        shutil.rmtree(self.directory, ignore_errors=True)


def stop(process: subprocess.Popen) -> None:
    """Kill a server and the test run it forked: they make up the server's own process group."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


@dataclass
class Score:
    module: str
    detected: list[Mutant] = field(default_factory=list)
    timed_out: list[Mutant] = field(default_factory=list)
    survived: list[Mutant] = field(default_factory=list)
    equivalent: list[Mutant] = field(default_factory=list)

    @property
    def counted(self) -> int:
        return len(self.detected) + len(self.timed_out) + len(self.survived)

    @property
    def percent(self) -> float:
        return 100.0 * (len(self.detected) + len(self.timed_out)) / self.counted if self.counted else 100.0


def judge_module(module: str, target: Target, mutants: list[Mutant], workspaces: queue.Queue, jobs: int,
                 equivalent: dict, timeout: float | None) -> Score:
    workspace = workspaces.get()
    try:
        baseline, seconds = workspace.run_tests(target.pytest_arguments(), 1800)
    finally:
        workspaces.put(workspace)
    if baseline != "passed":
        raise SystemExit(f"{module}: the unmutated tests do not pass ({baseline}); fix them first")
    limit = timeout or max(15.0, 3 * seconds)
    print(f"{module}: {len(mutants)} mutants of {target.path}, tests {' '.join(target.pytest_arguments()[4:])} "
          f"({seconds:.1f} s unmutated, timeout {limit:.0f} s)", flush=True)
    score = Score(module)

    def judge(mutant: Mutant) -> tuple[Mutant, str]:
        if (mutant.where(), mutant.description) in equivalent:
            return mutant, "equivalent"
        workspace = workspaces.get()
        try:
            workspace.write(mutant.path, mutated_source(mutant))
            outcome, _ = workspace.run_tests(target.pytest_arguments(), limit)
        finally:
            workspace.restore(mutant.path)
            workspaces.put(workspace)
        return mutant, outcome

    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for mutant, outcome in pool.map(judge, mutants):
            {"failed": score.detected, "timeout": score.timed_out, "passed": score.survived,
             "equivalent": score.equivalent}[outcome].append(mutant)
            print({"failed": ".", "timeout": "T", "passed": "S", "equivalent": "e"}[outcome], end="", flush=True)
    finally:  # on Ctrl-C, don't wait for the mutants under test: their servers are killed next
        pool.shutdown(wait=False, cancel_futures=True)
    print(flush=True)
    report(score)
    return score


def report(score: Score) -> None:
    print(f"{score.module}: {score.percent:.0f}% detected ({len(score.detected) + len(score.timed_out)} of "
          f"{score.counted}; {len(score.timed_out)} by timeout; {len(score.equivalent)} equivalent left out)")
    for mutant in score.survived:
        print(f"  survived {mutant.where()}  {mutant.description}")


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # so that a kill cleans up as Ctrl-C does


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--modules", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--sample", type=int, default=40, help="mutants per module at most (a seeded sample)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds per mutant (default: 3x the unmutated tests' time, at least 15)")
    parser.add_argument("--list", action="store_true", help="print the sampled mutants and exit")
    args = parser.parse_args(argv)
    modules = [name.strip() for name in args.modules.split(",") if name.strip()]
    unknown = [name for name in modules if name not in TARGETS]
    if unknown or args.sample < 1 or args.jobs < 1:
        parser.error(f"modules must be among {', '.join(TARGETS)} (got {', '.join(unknown)}); "
                     f"--sample and --jobs at least 1 (got {args.sample}, {args.jobs})")
    equivalent = load_equivalent()
    samples = {name: sample_mutants(name, TARGETS[name], args.sample, args.seed) for name in modules}
    if args.list:
        for name, mutants in samples.items():
            for mutant in mutants:
                print(f"{name}  {mutant.where()}  {mutant.description}")
        return 0
    signal.signal(signal.SIGTERM, interrupt)
    workspaces: queue.Queue[Workspace] = queue.Queue()
    created = []
    started = time.monotonic()
    try:
        for _ in range(args.jobs):
            created.append(Workspace(sys.executable))
            workspaces.put(created[-1])
        scores = [judge_module(name, TARGETS[name], samples[name], workspaces, args.jobs, equivalent, args.timeout)
                  for name in modules]
    except KeyboardInterrupt:
        print("\ninterrupted: the working tree was never modified; removing the copies", file=sys.stderr)
        return 130
    finally:
        for workspace in created:
            workspace.remove()
    print(f"\nmutation scores (seed {args.seed}, at most {args.sample} mutants per module, "
          f"{time.monotonic() - started:.0f} s):")
    for score in scores:
        report(score)
    return 0


if __name__ == "__main__":
    sys.exit(main())
